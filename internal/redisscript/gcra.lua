-- sluice GCRA and leaky bucket: run is one atomic decision on the call's
-- bucket.
--
-- This is applyGCRA (ratelimit/gcra.go) in Lua, for both algorithms: the
-- format byte keeps their states apart. Read gcra.go for the rules; the
-- comments here are about Lua. Bandwidth i's theoretical arrival time
-- (TAT) is tat[i] + frac[i] / rate µs, with 0 <= frac[i] < rate.
--
-- The stored value is prelude.lua's layout, whose pairs per bandwidth are
-- (frac, expiry - tat) and (0, 0): the TAT, all a config change needs
-- besides the ID. The expiry is the latest TAT rounded up (plus a new
-- bucket's warm-up, with initial tokens below capacity), so one bandwidth
-- of 10 a second or 100 a minute without an ID takes 22 bytes.

local OLD_FRAC, OLD_BACK = OLD_U1, OLD_S1

-- maxAhead is how far ahead of now, in scaled units, bandwidth i's TAT may
-- be after a reservation: 2^51µs, and 2^51 units beyond empty. The first
-- product is rounded past 2^53, and then not returned.
local function maxAhead(i)
  local c = 8 * i
  local horizon, debt = 2 ^ 51 * cfg[c + RATE], cfg[c + CAP] * cfg[c + SCALE] + 2 ^ 51
  if horizon < debt then
    return horizon
  end
  return debt
end

-- tat[i] and frac[i] are bandwidth i's state during a call: every call
-- sets them for its bandwidths before it reads them, so a library's calls
-- share the two tables.
local tat, frac = {}, {}

-- start makes bandwidth i a new bucket's, holding its initial tokens.
local function start(i)
  local c = 8 * i
  local rate, x = cfg[c + RATE], (cfg[c + CAP] - cfg[c + INITIAL]) * cfg[c + SCALE]
  local f = x % rate
  tat[i], frac[i] = now + (x - f) / rate, f
end

-- whole is the whole tokens bandwidth i conforms now: its burst less how
-- far its TAT is ahead, in scaled units. That product is rounded past
-- 2^53, and the difference then far below 0.
local function whole(i)
  local c = 8 * i
  local cap, scale = cfg[c + CAP], cfg[c + SCALE]
  if tat[i] < now then
    return cap
  end
  local x = cap * scale - (tat[i] - now) * cfg[c + RATE] - frac[i]
  if x <= 0 then
    return 0
  end
  return (x - x % scale) / scale
end

-- after is bandwidth i's TAT once t more tokens are taken.
local function after(i, t)
  local s, f = tat[i], frac[i]
  if s < now then
    s, f = now, 0
  end
  local rate = cfg[8 * i + RATE]
  f = f + t * cfg[8 * i + SCALE]
  local r = f % rate
  return s + (f - r) / rate, r
end

-- span is t tokens of bandwidth i in µs, t * scale = a * rate + b, as a
-- and b: exact for t < 2^53 while a is below 2^53. A product past 2^53 is
-- multiplied out by 7-bit digits of t, every partial sum below 2^53
-- (scale and rate are below 2^45).
local function span(i, t)
  local scale, rate = cfg[8 * i + SCALE], cfg[8 * i + RATE]
  local x = t * scale
  if x < SATURATED then
    local b = x % rate
    return (x - b) / rate, b
  end
  local a, b = 0, 0
  for k = 49, 0, -7 do
    local p = 2 ^ k
    local d = t % (128 * p)
    x = b * 128 + (d - d % p) / p * scale
    b = x % rate
    a = a * 128 + (x - b) / rate
  end
  return a, b
end

-- bandWait is the µs until bandwidth i conforms t tokens, 0 if it does.
local function bandWait(i, t)
  local c = 8 * i
  local rate, x = cfg[c + RATE], frac[i] + (t - cfg[c + CAP]) * cfg[c + SCALE]
  x = tat[i] - now + (x + -x % rate) / rate
  if x > 0 then
    return x
  end
  return 0
end

-- take takes t tokens from every bandwidth.
local function take(t)
  for i = 1, count do
    tat[i], frac[i] = after(i, t)
  end
end

-- lend: credit while every TAT stays within the debt limits; the product
-- is only compared.
local function lend(t)
  for i = 1, count do
    local s, f = after(i, t)
    if (s - now) * cfg[8 * i + RATE] + f > maxAhead(i) then
      return false
    end
  end
  return true
end

-- run is applyGCRA, as in ratelimit/gcra.go.
local function run()
  local raw, n, oldFp, exp, old = readState()
  if raw == nil then
    return n -- the error
  end
  if raw then
    -- An expiry past 2^53, or a TAT after it or before 0, is no state this
    -- script wrote.
    if exp > SATURATED then
      return corrupt()
    end
    for j = 1, n do
      local back = old[5 * j + OLD_BACK]
      if back < 0 or back > exp then
        return corrupt()
      end
    end
  end

  if not raw or op == RESET or now >= exp then
    for i = 1, count do
      start(i)
    end
  elseif op == REPLACE or oldFp ~= fp or n ~= count then
    -- A config change: a matched bandwidth keeps its TAT, rounded up to a
    -- whole µs and within the new debt limits.
    for i = 1, count do
      local j = match(i, old, n)
      if strategy == RESET_TOKENS or not j then
        start(i)
      else
        local t, rate, limit = exp - old[5 * j + OLD_BACK], cfg[8 * i + RATE], maxAhead(i)
        if old[5 * j + OLD_FRAC] > 0 then
          t = t + 1
        end
        limit = now + (limit - limit % rate) / rate
        if t > limit then
          t = limit
        end
        tat[i], frac[i] = t, 0
      end
    end
  else
    for i = 1, count do
      local f = old[5 * i + OLD_FRAC]
      if f >= cfg[8 * i + RATE] then
        return corrupt()
      end
      tat[i], frac[i] = exp - old[5 * i + OLD_BACK], f
    end
  end

  local allowed, consumed, retry, binding = 1, 0, 0, 0
  if op == ADD then
    -- Each TAT moves back tokens * T, to now at the earliest. T is at least
    -- 1µs: more tokens than whole µs ahead reach now.
    for i = 1, count do
      local s, f = now, 0
      if tokens <= tat[i] - now then
        local a, b = span(i, tokens)
        s, f = tat[i] - a, frac[i] - b
        if f < 0 then
          s, f = s - 1, f + cfg[8 * i + RATE]
        end
        if s < now then
          s, f = now, 0
        end
      end
      tat[i], frac[i] = s, f
    end
  elseif op ~= RESET and op ~= REPLACE then
    allowed, consumed, retry, binding = decide(bandWait, whole, take, lend)
  end

  -- Settle: the binding bandwidth (the one with the fewest tokens left unless
  -- a denial named one) and its next token, the time until every bandwidth
  -- is full, the time a new bucket takes to fill, and the expiry.
  local left
  binding, left = bindingOf(allowed, binding, whole)
  local refill = refillAfter(binding, left, bandWait)
  local resetAfter, warmup = 0, 0
  for i = 1, count do
    local c = 8 * i
    local w = tat[i] - now
    if frac[i] > 0 then
      w = w + 1
    end
    if w > resetAfter then
      resetAfter = w
    end
    local rate, x = cfg[c + RATE], (cfg[c + CAP] - cfg[c + INITIAL]) * cfg[c + SCALE]
    w = (x + -x % rate) / rate
    if w > warmup then
      warmup = w
    end
  end

  local expiry = now + resetAfter + warmup
  for i = 1, count do
    packed[4 * i - 3], packed[4 * i - 2], packed[4 * i - 1], packed[4 * i] = frac[i], expiry - tat[i], 0, 0
  end
  local reply = decision(allowed, consumed, binding, left, retry, resetAfter, refill)
  if not reply then
    return corrupt()
  end
  local err = store(packed, expiry, raw and exp)
  if err then
    return err
  end
  return reply
end
