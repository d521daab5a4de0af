-- sluice token bucket: one atomic decision on the bucket at KEYS[1].
--
-- This is ratelimit.Apply (ratelimit/tokenbucket.go) written in Lua; the two
-- must agree to the microsecond and the scaled unit, and the tests of
-- internal/redisscript compare them state for state. Read Apply's comments
-- for the why of each rule; the comments here are about Lua.
--
-- Lua numbers are doubles. Every integer here stays within 2^53, where
-- doubles are exact (ratelimit.Config.Validate bounds the inputs for that),
-- and every division rounds through fdiv or cdiv, exact there. Products
-- that could pass 2^53 are only compared, never stored: a rounded product
-- that reaches 2^53 is still larger than anything it is compared with.
--
-- ARGV[1] is the request, packed by NewCall in call.go (little-endian):
--   c8 fingerprint, B op, d tokens, d max wait (µs), B strategy,
--   d now (µs; negative: use the server's TIME), B bandwidth count, then per
--   bandwidth: B refill kind, d capacity, d scale, d rate, d period (µs),
--   d initial tokens, d aligned start (µs), B ID length, c ID.
--
-- The stored value (the tests decode it in state_test.go) is
--   B format (1), c8 fingerprint, varint expiry (µs), then per bandwidth:
--   varint capacity, varint scale, zigzag varint level,
--   zigzag varint (expiry - stamp), B ID length, c ID.
--
-- The reply is {allowed, consumed, limit, remaining, retry after (µs),
-- reset after (µs), binding bandwidth index (0-based)}.

local GREEDY, ALIGNED = 0, 2
local CONSUME, ESTIMATE, RESERVE, CONSUME_UP_TO, ADD, RESET, REPLACE, INSPECT = 0, 1, 2, 3, 4, 5, 6, 7
local RESET_TOKENS, PROPORTIONALLY, ADDITIVE = 1, 2, 3
local FORMAT = 1
local MAX_SCALED = 2 ^ 51
local MAX_HORIZON = 2 ^ 51
local SATURATED = 2 ^ 53
local GRACE = 60000 -- ms a key outlives its expiry on a caller's clock

local floor, min, max = math.floor, math.min, math.max
local byte, char, sub = string.byte, string.char, string.sub

-- fdiv is floor(a/b) for b > 0. With |a| and b integers below 2^53 the
-- rounded quotient never crosses an integer: a quotient that is not whole
-- lies at least 1/b from one, and rounding moves it by at most
-- (a/b)·2^-53 < 1/b.
local function fdiv(a, b)
  return floor(a / b)
end

-- cdiv is ceil(a/b) for b > 0.
local function cdiv(a, b)
  return -fdiv(-a, b)
end

-- mulDivFloor is floor(a*b/c) for 1 <= b, c <= 2^50 and |a| <= 2^52, exact,
-- saturating at ±2^53 where the result passes 2^52 (every caller clamps it
-- to less than that).
local function mulDivFloor(a, b, c)
  local neg = a < 0
  if neg then
    a = -a
  end
  local whole = fdiv(a, c)
  if whole > 0 and whole > fdiv(2 ^ 52, b) then
    return neg and -SATURATED or SATURATED
  end
  -- a*b = whole*b*c + part*b; part*b/c by binary long multiplication,
  -- keeping the remainder below c so that nothing passes 2^52.
  local part = a - whole * c
  local q, r = 0, 0
  for k = 51, 0, -1 do
    local bit = floor(b / 2 ^ k) % 2
    q, r = q * 2, r * 2
    if r >= c then
      q, r = q + 1, r - c
    end
    if bit == 1 then
      r = r + part
      if r >= c then
        q, r = q + 1, r - c
      end
    end
  end
  q = q + whole * b
  if neg then
    if r > 0 then
      q = q + 1
    end
    return -q
  end
  return q
end

-- The request.

local fp, op, tokens, maxWait, strategy, now, count, pos = struct.unpack('<c8BddBdB', ARGV[1])
local clockGiven = now >= 0
if not clockGiven then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cfg = {}
for i = 1, count do
  local b = {}
  b.kind, b.cap, b.scale, b.rate, b.period, b.initial, b.start, b.id, pos =
    struct.unpack('<BddddddBc0', ARGV[1], pos)
  b.full = b.cap * b.scale
  cfg[i] = b
end

-- The stored state.

-- decodeState returns the state in v, or nil if v is not a well-formed
-- state.
local function decodeState(v)
  local n, at = #v, 10
  local function varint()
    local x, mul = 0, 1
    repeat
      local c = byte(v, at)
      if c == nil or mul > 2 ^ 49 then
        return nil
      end
      at = at + 1
      x = x + (c % 128) * mul
      mul = mul * 128
    until c < 128
    return x
  end
  local function zigzag()
    local x = varint()
    if x == nil or x % 2 == 0 then
      return x and x / 2
    end
    return -(x + 1) / 2
  end
  local s = {fp = sub(v, 2, 9), bands = {}}
  s.exp = varint()
  if n < 9 or s.exp == nil then
    return nil
  end
  while at <= n and #s.bands < 16 do
    local b = {}
    b.cap = varint()
    b.scale = varint()
    b.level = zigzag()
    local back = zigzag()
    local idlen = byte(v, at)
    if b.cap == nil or b.cap < 1 or b.scale == nil or b.scale < 1 or b.level == nil or back == nil or idlen == nil then
      return nil
    end
    b.stamp = s.exp - back
    b.id = sub(v, at + 1, at + idlen)
    at = at + 1 + idlen
    s.bands[#s.bands + 1] = b
  end
  if at ~= n + 1 then
    return nil
  end
  return s
end

local function encodeState(exp, bands)
  local out = {}
  local function varint(x)
    while x >= 128 do
      local low = x % 128
      out[#out + 1] = char(low + 128)
      x = (x - low) / 128
    end
    out[#out + 1] = char(x)
  end
  local function zigzag(x)
    if x >= 0 then
      varint(2 * x)
    else
      varint(-2 * x - 1)
    end
  end
  out[1] = char(FORMAT)
  out[2] = fp
  varint(exp)
  for i = 1, #bands do
    local b = bands[i]
    varint(b.cap)
    varint(b.scale)
    zigzag(b.level)
    zigzag(exp - b.stamp)
    out[#out + 1] = char(#b.id)
    out[#out + 1] = b.id
  end
  return table.concat(out)
end

-- The math, as in ratelimit/tokenbucket.go.

local function periodStart(b, t)
  if b.kind ~= ALIGNED then
    return t
  end
  return b.start + fdiv(t - b.start, b.period) * b.period
end

local function fresh(b)
  return {id = b.id, cap = b.cap, scale = b.scale, level = b.initial * b.scale, stamp = periodStart(b, now)}
end

local function minLevel(b)
  if b.kind ~= GREEDY then
    return max(-MAX_SCALED, b.full - fdiv(MAX_HORIZON, b.period) * b.rate)
  end
  local debt = MAX_HORIZON * b.rate
  if debt >= b.full + MAX_SCALED then
    return -MAX_SCALED
  end
  return b.full - debt
end

local function match(old, id, i)
  if id == '' then
    if old[i] and old[i].id == '' then
      return old[i]
    end
    return nil
  end
  for j = 1, #old do
    if old[j].id == id then
      return old[j]
    end
  end
  return nil
end

local function inherit(t, oldCap, newCap)
  if strategy == PROPORTIONALLY then
    return mulDivFloor(t, newCap, oldCap)
  elseif strategy == ADDITIVE then
    return min(t, newCap) + max(0, newCap - oldCap)
  end
  return min(t, newCap)
end

local function convert(old)
  local bands = {}
  for i = 1, count do
    local b = cfg[i]
    local nb = fresh(b)
    local o = match(old, b.id, i)
    if strategy ~= RESET_TOKENS and o then
      local t = inherit(fdiv(o.level, o.scale), o.cap, b.cap)
      nb.level = max(t, cdiv(minLevel(b), b.scale)) * b.scale
      nb.stamp = periodStart(b, o.stamp)
    end
    bands[i] = nb
  end
  return bands
end

local function refill(b, s)
  local elapsed = now - s.stamp
  if elapsed <= 0 then
    return
  end
  if s.level >= b.full then
    s.stamp = periodStart(b, now)
    return
  end
  if b.kind == GREEDY then
    if elapsed * b.rate >= b.full - s.level then
      s.level = b.full
    else
      s.level = s.level + elapsed * b.rate
    end
    s.stamp = now
    return
  end
  local periods = fdiv(elapsed, b.period)
  if periods == 0 then
    return
  end
  if periods >= cdiv(b.full - s.level, b.rate) then
    s.level, s.stamp = b.full, periodStart(b, now)
    return
  end
  s.level = s.level + periods * b.rate
  s.stamp = s.stamp + periods * b.period
end

local function timeTo(b, s, level)
  local short = level - s.level
  if short <= 0 then
    return 0
  end
  if b.kind == GREEDY then
    return cdiv(short, b.rate) + max(0, s.stamp - now)
  end
  return s.stamp + cdiv(short, b.rate) * b.period - now
end

local function remaining(s)
  if s.level <= 0 then
    return 0
  end
  return fdiv(s.level, s.scale)
end

-- Apply.

local raw = redis.call('GET', KEYS[1])
local state
if raw then
  if byte(raw, 1) ~= FORMAT then
    return redis.error_reply('sluice: key ' .. KEYS[1] .. ' holds a value sluice did not write')
  end
  state = decodeState(raw)
  if state == nil then
    return redis.error_reply('sluice: corrupt state at key ' .. KEYS[1])
  end
end

local bands
if state == nil or op == RESET or now >= state.exp then
  bands = {}
  for i = 1, count do
    bands[i] = fresh(cfg[i])
  end
elseif op == REPLACE or state.fp ~= fp or #state.bands ~= count then
  bands = convert(state.bands)
else
  bands = state.bands
end
for i = 1, count do
  refill(cfg[i], bands[i])
end

local function waitFor(n)
  local wait, slowest = 0, 1
  for i = 1, count do
    local w = timeTo(cfg[i], bands[i], n * cfg[i].scale)
    if w > wait then
      wait, slowest = w, i
    end
  end
  return wait, slowest
end

local function canReserve(n, wait)
  if wait > maxWait then
    return false
  end
  for i = 1, count do
    if bands[i].level - n * cfg[i].scale < minLevel(cfg[i]) then
      return false
    end
  end
  return true
end

local function take(n)
  for i = 1, count do
    bands[i].level = bands[i].level - n * cfg[i].scale
  end
end

local allowed, consumed, retry, binding = 1, 0, 0, 0
if op == CONSUME or op == ESTIMATE or op == RESERVE or op == INSPECT then
  local n = tokens
  if op == INSPECT then
    n = 1
  end
  local wait, slowest = waitFor(n)
  if (op == CONSUME and wait == 0) or (op == RESERVE and canReserve(n, wait)) then
    take(n)
    consumed, retry = n, wait
  elseif wait > 0 then
    allowed, retry, binding = 0, wait, slowest
  end
elseif op == CONSUME_UP_TO then
  local available = SATURATED
  for i = 1, count do
    available = min(available, remaining(bands[i]))
  end
  local n = min(tokens, available)
  if n > 0 then
    take(n)
    consumed = n
  else
    local wait, slowest = waitFor(1)
    allowed, retry, binding = 0, wait, slowest
  end
elseif op == ADD then
  for i = 1, count do
    local b, s = cfg[i], bands[i]
    s.level = min(b.full, s.level + min(tokens, cdiv(b.full - s.level, b.scale)) * b.scale)
    if s.level == b.full and now > s.stamp then
      s.stamp = periodStart(b, now)
    end
  end
end

-- Settle: the binding bandwidth (the one with the fewest tokens left unless
-- a denial named one), the time to full, and the expiry.
local resetAfter, least = 0, SATURATED
for i = 1, count do
  local b, s = cfg[i], bands[i]
  local r = remaining(s)
  if allowed == 1 and r < least then
    least, binding = r, i
  end
  resetAfter = max(resetAfter, timeTo(b, s, b.full))
end
local warmup = 0
for i = 1, count do
  local b = cfg[i]
  if b.initial ~= b.cap then
    warmup = max(warmup, timeTo(b, {level = b.initial * b.scale, stamp = periodStart(b, now)}, b.full))
  end
end
-- The key lives until the state equals a new bucket's, plus a millisecond
-- for the server's own clock, which may have read a little earlier than
-- TIME. A caller's clock need not keep pace with the server's, so with one
-- the key lives a minute longer; the expiry in the state still decides.
local exp = now + resetAfter + warmup
if exp > now then
  local ttl = cdiv(exp - now, 1000) + 1
  if clockGiven then
    ttl = ttl + GRACE
  end
  redis.call('SET', KEYS[1], encodeState(exp, bands), 'PX', ttl)
else
  redis.call('DEL', KEYS[1])
end
local bb = bands[binding]
return {allowed, consumed, cfg[binding].cap, remaining(bb), retry, resetAfter, binding - 1}
