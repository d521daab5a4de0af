-- sluice GCRA and leaky bucket: one atomic decision on the bucket at KEYS[1].
--
-- This is applyGCRA (ratelimit/gcra.go) written in Lua, for both
-- algorithms: the format byte keeps their states apart. The two must agree
-- to the microsecond and the scaled unit, and the tests of
-- internal/redisscript compare them state for state. Read gcra.go for the
-- why of each rule; the comments here are about Lua.
--
-- The stored value is prelude.lua's layout with the token bucket's pairs:
-- (capacity, whole tokens: floor(level / scale)) and (fraction: the rest of
-- the level in scaled units, expiry - stamp). Bandwidth i's theoretical
-- arrival time is stamp + (capacity * scale - level) / rate; gcra.go says
-- why the level is kept rather than the TAT. Every bandwidth is greedy.

local MAX_SCALED = 2 ^ 51
local MAX_HORIZON = 2 ^ 51
local OLD_CAP, OLD_TOKENS, OLD_FRACTION, OLD_BACK = OLD_U1, OLD_S1, OLD_U2, OLD_S2

-- minLevel is the lowest level reservations may take bandwidth i to.
local function minLevel(i)
  local c = 8 * i
  local f, debt = cfg[c + CAP] * cfg[c + SCALE], MAX_HORIZON * cfg[c + RATE]
  if debt >= f + MAX_SCALED then
    return -MAX_SCALED
  end
  return f - debt
end

-- Apply, as in ratelimit/gcra.go.

local raw, n, oldFp, exp, old = readState()
if raw == nil then
  return n -- the error
end
if raw then
  for j = 1, n do
    local cap, tokens = old[5 * j + OLD_CAP], old[5 * j + OLD_TOKENS]
    if cap < 1 or cap > 2 ^ 50 or tokens > cap or tokens < -MAX_SCALED or old[5 * j + OLD_FRACTION] >= MAX_SCALED then
      return corrupt()
    end
  end
end

-- level[i] and stamp[i] are bandwidth i's state, built for cfg.
local level, stamp = {}, {}
if not raw or op == RESET or now >= exp then
  for i = 1, count do
    level[i], stamp[i] = cfg[8 * i + INITIAL] * cfg[8 * i + SCALE], now
  end
elseif op == REPLACE or oldFp ~= fp or n ~= count then
  -- A config change.
  for i = 1, count do
    local c = 8 * i
    local scale = cfg[c + SCALE]
    level[i], stamp[i] = cfg[c + INITIAL] * scale, now
    local j = match(i, old, n)
    if strategy ~= RESET_TOKENS and j then
      local o = 5 * j
      local t = inherit(old[o + OLD_TOKENS], old[o + OLD_CAP], cfg[c + CAP])
      local least = minLevel(i)
      least = (least + -least % scale) / scale
      if t < least then
        t = least
      end
      level[i], stamp[i] = t * scale, exp - old[o + OLD_BACK]
    end
  end
else
  for i = 1, count do
    local o, cap, scale = 5 * i, cfg[8 * i + CAP], cfg[8 * i + SCALE]
    local fraction = old[o + OLD_FRACTION]
    local l = old[o + OLD_TOKENS] * scale + fraction
    if old[o + OLD_CAP] ~= cap or fraction >= scale or l > cap * scale or l < -MAX_SCALED then
      return corrupt()
    end
    level[i], stamp[i] = l, exp - old[o + OLD_BACK]
  end
end

-- Refill: the TAT becomes max(TAT, now). A product past 2^53 is inexact,
-- but then so far past the capacity that the sum is still capped.
for i = 1, count do
  if now > stamp[i] then
    local c = 8 * i
    local f = cfg[c + CAP] * cfg[c + SCALE]
    local l = level[i] + (now - stamp[i]) * cfg[c + RATE]
    if l > f then
      l = f
    end
    level[i], stamp[i] = l, now
  end
end

-- From here on stamp[i] >= now; stamp[i] - now is the lag of a clock that
-- stepped back.

-- waitFor is the µs until every bandwidth conforms t tokens, and the
-- bandwidth that takes longest.
local function waitFor(t)
  local wait, slowest = 0, 1
  for i = 1, count do
    local c = 8 * i
    local rate, short = cfg[c + RATE], t * cfg[c + SCALE] - level[i]
    local w = stamp[i] - now + (short + -short % rate) / rate
    if w > wait then
      wait, slowest = w, i
    end
  end
  return wait, slowest
end

-- whole is the whole tokens bandwidth i conforms now, none when in debt or
-- lagging past its level (the product is then only compared).
local function whole(i)
  local c = 8 * i
  local l = level[i] - (stamp[i] - now) * cfg[c + RATE]
  if l <= 0 then
    return 0
  end
  local scale = cfg[c + SCALE]
  return (l - l % scale) / scale
end

local function take(t)
  for i = 1, count do
    level[i] = level[i] - t * cfg[8 * i + SCALE]
  end
end

local allowed, consumed, retry, binding = 1, 0, 0, 0
if op == CONSUME or op == ESTIMATE or op == RESERVE or op == INSPECT then
  local t = tokens
  if op == INSPECT then
    t = 1
  end
  local wait, slowest = waitFor(t)
  local take_ = op == CONSUME and wait == 0
  if op == RESERVE and wait <= maxWait then
    -- Reserve takes on credit down to each bandwidth's debt limit.
    take_ = true
    for i = 1, count do
      if level[i] - t * cfg[8 * i + SCALE] < minLevel(i) then
        take_ = false
      end
    end
  end
  if take_ then
    take(t)
    consumed, retry = t, wait
  elseif wait > 0 then
    allowed, retry, binding = 0, wait, slowest
  end
elseif op == CONSUME_UP_TO then
  local t = tokens
  for i = 1, count do
    local r = whole(i)
    if r < t then
      t = r
    end
  end
  if t > 0 then
    take(t)
    consumed = t
  else
    local wait, slowest = waitFor(1)
    allowed, retry, binding = 0, wait, slowest
  end
elseif op == ADD then
  -- The TAT moves back tokens intervals, to the stamp at the earliest.
  for i = 1, count do
    local scale = cfg[8 * i + SCALE]
    local f = cfg[8 * i + CAP] * scale
    local short = f - level[i]
    local t = (short + -short % scale) / scale
    if tokens < t then
      t = tokens
    end
    level[i] = level[i] + t * scale
    if level[i] > f then
      level[i] = f
    end
  end
end

-- Settle: the binding bandwidth (the one with the fewest tokens left unless
-- a denial named one), the time until every TAT has passed, and the expiry.
local resetAfter, least, left = 0, SATURATED, 0
for i = 1, count do
  local c = 8 * i
  local r = whole(i)
  if allowed == 1 and r < least then
    least, binding = r, i
  end
  if i == binding then
    left = r
  end
  local rate, short = cfg[c + RATE], cfg[c + CAP] * cfg[c + SCALE] - level[i]
  local w = stamp[i] - now + (short + -short % rate) / rate
  if w > resetAfter then
    resetAfter = w
  end
end
local warmup = 0
for i = 1, count do
  local c = 8 * i
  local short = (cfg[c + CAP] - cfg[c + INITIAL]) * cfg[c + SCALE]
  local rate = cfg[c + RATE]
  local w = (short + -short % rate) / rate
  if w > warmup then
    warmup = w
  end
end

local expiry = now + resetAfter + warmup
if expiry > now then
  local packed = {}
  for i = 1, count do
    local c = 8 * i
    local scale = cfg[c + SCALE]
    local fraction = level[i] % scale
    packed[4 * i - 3], packed[4 * i - 2], packed[4 * i - 1], packed[4 * i] =
      cfg[c + CAP], (level[i] - fraction) / scale, fraction, expiry - stamp[i]
  end
  local v = encodeState(packed, expiry)
  if v == nil then
    return corrupt()
  end
  store(v, expiry, raw and exp)
else
  store(nil, expiry)
end
return {allowed, consumed, cfg[8 * binding + CAP], left, retry, resetAfter, binding - 1}
