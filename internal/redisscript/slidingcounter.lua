-- sluice sliding window counter: run is one atomic decision on the call's
-- bucket.
--
-- This is applyCounter (ratelimit/slidingcounter.go) written in Lua; the
-- two must agree to the microsecond, and the tests of internal/redisscript
-- compare them state for state. Read its comments for the why of each
-- rule; the comments here are about Lua.
--
-- The stored value is prelude.lua's layout, whose pairs per bandwidth are
-- (cur, prev): the counts of the current and the previous window, and
-- (period, expiry - stamp): the period tells a config change whether the
-- windows still line up, and the stamp is the current window's start. Both
-- counters of every bandwidth live in the one key, so the script works on
-- Redis Cluster as is.

local MAX_PERIOD = 366 * 24 * 3600 * 1000000
local MAX_COUNT = 2 ^ 50
local MAX_CLOCK = 2 ^ 52

local OLD_CUR, OLD_PREV, OLD_PERIOD, OLD_BACK = OLD_U1, OLD_S1, OLD_U2, OLD_S2

-- cur[i], prev[i] and stamp[i] are bandwidth i's state, which run builds
-- for cfg on every call: tables of the library's, made once, as the
-- helpers below are.
local cur, prev, stamp = {}, {}, {}

-- room is how many requests bandwidth i admits now. Both products are at
-- most capacity × period, within 2^53; so is their difference, and it is
-- floored only when positive.
local function room(i)
  local c = 8 * i
  local w = cfg[c + PERIOD]
  local e = now - stamp[i]
  if e < 0 then
    e = 0
  end
  local x = (cfg[c + CAP] - cur[i]) * w - prev[i] * (w - e)
  if x <= 0 then
    return 0
  end
  return (x - x % w) / w
end

-- bandWait is the µs until bandwidth i admits t requests (t at most its
-- capacity), 0 if it does now.
local function bandWait(i, t)
  if t <= room(i) then
    return 0
  end
  local c = 8 * i
  local w, cap = cfg[c + PERIOD], cfg[c + CAP]
  local due
  if cur[i] + t <= cap then
    local a = (cap - cur[i] - t) * w
    due = stamp[i] + w - (a - a % prev[i]) / prev[i]
  else
    local a = (cap - t) * w
    due = stamp[i] + 2 * w - (a - a % cur[i]) / cur[i]
  end
  return due - now
end

local function take(t)
  for i = 1, count do
    cur[i] = cur[i] + t
  end
end

-- run is applyCounter, as in ratelimit/slidingcounter.go.
local function run()
  local raw, n, oldFp, exp, old = readState()
  if raw == nil then
    return n -- the error
  end
  if raw then
    for j = 1, n do
      local o = 5 * j
      local prev, w = old[o + OLD_PREV], old[o + OLD_PERIOD]
      local stamp = exp - old[o + OLD_BACK]
      if old[o + OLD_CUR] > MAX_COUNT or prev < 0 or prev > MAX_COUNT or w < 1 or w > MAX_PERIOD or
        stamp < 0 or stamp >= MAX_CLOCK or stamp % w ~= 0 then
        return corrupt()
      end
    end
  end

  if not raw or op == RESET or now >= exp then
    for i = 1, count do
      local w = cfg[8 * i + PERIOD]
      cur[i], prev[i], stamp[i] = 0, 0, now - now % w
    end
  elseif op == REPLACE or oldFp ~= fp or n ~= count then
    -- A config change: a matched bandwidth keeps its counts as of now,
    -- rolled on its old period; only the current one if the period changed.
    for i = 1, count do
      local c = 8 * i
      local w, cap = cfg[c + PERIOD], cfg[c + CAP]
      cur[i], prev[i], stamp[i] = 0, 0, now - now % w
      local j = match(i, old, n)
      if strategy ~= RESET_TOKENS and j then
        local o = 5 * j
        local x, p, ow = old[o + OLD_CUR], old[o + OLD_PREV], old[o + OLD_PERIOD]
        local s = exp - old[o + OLD_BACK]
        if now >= s + 2 * ow then
          x, p, s = 0, 0, now - now % ow
        elseif now >= s + ow then
          x, p, s = 0, x, now - now % ow
        end
        if x > cap then
          x = cap
        end
        cur[i] = x
        if ow == w then
          if p > cap then
            p = cap
          end
          prev[i], stamp[i] = p, s
        end
      end
    end
  else
    for i = 1, count do
      local o, c = 5 * i, 8 * i
      local x, p, cap = old[o + OLD_CUR], old[o + OLD_PREV], cfg[c + CAP]
      if old[o + OLD_PERIOD] ~= cfg[c + PERIOD] or x > cap or p > cap or old[o + OLD_ID] ~= cfg[c + ID] then
        return corrupt()
      end
      cur[i], prev[i], stamp[i] = x, p, exp - old[o + OLD_BACK]
    end
  end

  -- Roll each bandwidth to the window that holds now.
  for i = 1, count do
    local w, s = cfg[8 * i + PERIOD], stamp[i]
    if now >= s + w then
      if now >= s + 2 * w then
        prev[i] = 0
      else
        prev[i] = cur[i]
      end
      cur[i], stamp[i] = 0, now - now % w
    end
  end

  local allowed, consumed, retry, binding = 1, 0, 0, 0
  if op == ADD then
    refund(cur, tokens)
  elseif op ~= RESET and op ~= REPLACE then
    allowed, consumed, retry, binding = decide(bandWait, room, take)
  end

  -- Settle: the binding bandwidth and when it admits one more request, and
  -- the expiry: when every count has rolled out.
  local left
  binding, left = bindingOf(allowed, binding, room)
  local refill = refillAfter(binding, left, bandWait)
  local expiry = now
  for i = 1, count do
    local at = 0
    if cur[i] > 0 then
      at = stamp[i] + 2 * cfg[8 * i + PERIOD]
    elseif prev[i] > 0 then
      at = stamp[i] + cfg[8 * i + PERIOD]
    end
    if at > expiry then
      expiry = at
    end
  end

  for i = 1, count do
    packed[4 * i - 3], packed[4 * i - 2], packed[4 * i - 1], packed[4 * i] =
      cur[i], prev[i], cfg[8 * i + PERIOD], expiry - stamp[i]
  end
  local reply = decision(allowed, consumed, binding, left, retry, expiry - now, refill)
  if not reply then
    return corrupt()
  end
  local err = store(packed, expiry, raw and exp)
  if err then
    return err
  end
  return reply
end
