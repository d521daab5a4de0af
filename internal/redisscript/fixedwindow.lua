-- sluice fixed window: run is one atomic decision on the call's bucket.
--
-- This is ratelimit's applyFixedWindow (ratelimit/fixedwindow.go) in Lua;
-- read its comments for the rules. Bandwidth i has hits[i] requests counted
-- in a window that ends at ends[i]; with no hits it has no window.
--
-- The stored value is prelude.lua's layout, whose pairs per bandwidth are
-- (expiry - window start, count) and (0, 0); (0, 0) and (0, 0) for a
-- bandwidth with no count. A config change needs the count, the start and
-- the ID. The expiry is the latest window's end, so the first field is the
-- bandwidth's period, or a little more, and the count, at most the period,
-- seldom needs a wider pair: one bandwidth of 100 a second without an ID
-- takes 26 bytes, of 100 a minute 28.
--
-- On the server's clock a call that changes nothing (Estimate, Inspect, a
-- denial, with no window over) writes nothing: the value and TTL it would
-- write are those stored.

-- No window of a valid state ends this late: a window starts by 2^52µs
-- (the latest clock) and lasts at most 366 days, under 2^45µs.
local LATEST = 2 ^ 52 + 2 ^ 45

local OLD_BACK, OLD_HITS = OLD_U1, OLD_S1

-- hits[i] and ends[i] are bandwidth i's count and window end, which run
-- builds on every call, and dirty whether the value or its TTL must be
-- written: the library's, made once, as the helpers below are.
local hits, ends, dirty = {}, {}, false

-- take counts t requests in every bandwidth, opening the windows of those
-- that have none.
local function take(t)
  for i = 1, count do
    if hits[i] == 0 then
      local c = 8 * i
      local start, period = now, cfg[c + PERIOD]
      if cfg[c + KIND] == ALIGNED then
        start = now - (now - cfg[c + START]) % period
      end
      ends[i] = start + period
    end
    hits[i] = hits[i] + t
  end
  dirty = true
end

-- bandWait is the µs until bandwidth i has room for t more requests: 0,
-- or the end of its window (a bandwidth without room has one).
local function bandWait(i, t)
  if hits[i] + t > cfg[8 * i + CAP] then
    return ends[i] - now
  end
  return 0
end

-- room is the requests bandwidth i has left in its window.
local function room(i)
  return cfg[8 * i + CAP] - hits[i]
end

-- run is applyFixedWindow.
local function run()
  local raw, n, oldFp, exp, old = readState()
  if raw == nil then
    return n -- the error
  end
  if raw and exp >= LATEST then
    return corrupt()
  end

  dirty = clockGiven
  if not raw or op == RESET or now >= exp then
    dirty = true
    for i = 1, count do
      hits[i] = 0
    end
  elseif op == REPLACE or oldFp ~= fp or n ~= count then
    -- A config change: a matched bandwidth keeps its count, up to its new
    -- capacity, and its window's start, moved back to its boundary if
    -- aligned; the window may so be over.
    dirty = true
    for i = 1, count do
      hits[i] = 0
      local j = match(i, old, n)
      if strategy ~= RESET_TOKENS and j then
        local c, o = 8 * i, 5 * j
        local h = old[o + OLD_HITS]
        if h < 0 then
          return corrupt()
        elseif h > 0 then
          local start, period = exp - old[o + OLD_BACK], cfg[c + PERIOD]
          if cfg[c + KIND] == ALIGNED then
            start = start - (start - cfg[c + START]) % period
          end
          if now < start + period then
            if h > cfg[c + CAP] then
              h = cfg[c + CAP]
            end
            hits[i], ends[i] = h, start + period
          end
        end
      end
    end
  else
    for i = 1, count do
      local c, o = 8 * i, 5 * i
      local h, back, period = old[o + OLD_HITS], old[o + OLD_BACK], cfg[c + PERIOD]
      -- A count beyond the capacity, or a window that ends after the
      -- expiry, is no state this script wrote.
      if h < 0 or h > cfg[c + CAP] or h > 0 and back < period then
        return corrupt()
      end
      hits[i] = 0
      if h > 0 then
        local e = exp - back + period
        if now < e then
          hits[i], ends[i] = h, e
        else
          dirty = true
        end
      end
    end
  end

  local allowed, consumed, retry, binding = 1, 0, 0, 0
  if op == ADD then
    refund(hits, tokens)
    dirty = true
  elseif op ~= RESET and op ~= REPLACE then
    allowed, consumed, retry, binding = decide(bandWait, room, take)
  end

  -- Settle: the binding bandwidth and when its window ends, and the expiry:
  -- when the last window ends.
  local left
  binding, left = bindingOf(allowed, binding, room)
  local refill = refillAfter(binding, left, bandWait)
  local expiry = now
  for i = 1, count do
    if hits[i] > 0 and ends[i] > expiry then
      expiry = ends[i]
    end
  end

  local reply = decision(allowed, consumed, binding, left, retry, expiry - now, refill)
  if not reply then
    return corrupt()
  end
  if dirty then
    for i = 1, count do
      local h = hits[i]
      local back = 0
      if h > 0 then
        back = expiry - ends[i] + cfg[8 * i + PERIOD]
      end
      packed[4 * i - 3], packed[4 * i - 2], packed[4 * i - 1], packed[4 * i] = back, h, 0, 0
    end
    local err = store(packed, expiry, raw and exp)
    if err then
      return err
    end
  end
  return reply
end
