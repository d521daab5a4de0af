-- sluice token bucket: one atomic decision on the bucket at KEYS[1].
--
-- This is ratelimit.Apply (ratelimit/tokenbucket.go) written in Lua; the two
-- must agree to the microsecond and the scaled unit, and the tests of
-- internal/redisscript compare them state for state. Read Apply's comments
-- for the why of each rule; the comments here are about Lua.
--
-- Lua numbers are doubles. Every integer here stays within 2^53, where
-- doubles are exact (ratelimit.Config.Validate bounds the inputs for that),
-- and every division rounds exactly (see below). Products that could pass
-- 2^53 are only compared, never stored: a rounded product that reaches 2^53
-- is still larger than anything it is compared with.
--
-- ARGV[1] is the request, packed by NewCall in call.go (little-endian):
--   c8 fingerprint, B op, d tokens, d max wait (µs), B strategy,
--   d now (µs; negative: use the server's TIME), B bandwidth count, then per
--   bandwidth: B refill kind, d capacity, d scale, d rate, d period (µs),
--   d initial tokens, d aligned start (µs), B ID length, c ID.
--
-- The stored value (the tests decode it in state_test.go) is
--   B FORMAT + bandwidth count - 1, c8 fingerprint, I7 expiry (µs), then a
--   byte per bandwidth giving the widths of its fields (high nibble: of
--   capacity and tokens; low nibble: of fraction and stamp), then per
--   bandwidth: In capacity, in whole tokens (floor(level / scale)), In
--   fraction (the rest of the level, in scaled units), in (expiry - stamp),
--   with n from 1 to 7 bytes as its width byte says, B ID length, c ID.
--
-- The reply is {allowed, consumed, limit, remaining, retry after (µs),
-- reset after (µs), binding bandwidth index (0-based)}.

local GREEDY, ALIGNED = 0, 2
local CONSUME, ESTIMATE, RESERVE, CONSUME_UP_TO, ADD, RESET, REPLACE, INSPECT = 0, 1, 2, 3, 4, 5, 6, 7
local RESET_TOKENS, PROPORTIONALLY, ADDITIVE = 1, 2, 3
local FORMAT = 16 -- the first byte of a state is FORMAT + bandwidths - 1
local MAX_SCALED = 2 ^ 51
local MAX_HORIZON = 2 ^ 51
local SATURATED = 2 ^ 53
local GRACE = 60000 -- ms a key outlives its expiry on a caller's clock

-- The script runs for every decision, so it is written for Redis's Lua,
-- where (counted with callgrind on redis-server 7.0.15) a function call,
-- Lua or C, costs about ten times an arithmetic operation, and a table or
-- string made costs a few thousand instructions. Hence:
--
--   - data lives in a handful of flat arrays indexed by bandwidth;
--   - floor(a/b), for b > 0, is written (a - a % b) / b and ceil(a/b) as
--     (a + -a % b) / b: % is an operation, math.floor a call. Both are
--     exact for integers below 2^53: a % b is a - floor(a/b)·b, and a/b
--     rounded never crosses an integer (a quotient that is not whole lies
--     at least 1/b from one; rounding moves it by at most (a/b)·2^-53);
--   - min and max are comparisons, not calls.

local byte, rep = string.byte, string.rep

-- The request: one unpack. cfg holds the header, then 8 fields per
-- bandwidth; bandwidth i's field F is cfg[8 * i + F].
local arg = ARGV[1]
local count = byte(arg, 35)
local format = '<c8BddBdBBddddddBc0'
if count > 1 then
  format = format .. rep('BddddddBc0', count - 1)
end
local cfg = {struct.unpack(format, arg)}
local fp, op, tokens, maxWait, strategy, now = cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6]
local KIND, CAP, SCALE, RATE, PERIOD, INITIAL, START, ID = 0, 1, 2, 3, 4, 5, 6, 7

local clockGiven = now >= 0
if not clockGiven then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] -- Lua converts the strings
end

local function periodStart(i, t)
  local c = 8 * i
  if cfg[c + KIND] ~= ALIGNED then
    return t
  end
  local since, period = t - cfg[c + START], cfg[c + PERIOD]
  return t - since % period
end

-- timeTo is the µs from now until bandwidth i, at level and stamp, holds
-- target scaled units.
local function timeTo(i, level, stamp, target)
  local short = target - level
  if short <= 0 then
    return 0
  end
  local c = 8 * i
  local rate = cfg[c + RATE]
  -- Greedy: the µs it takes; Interval kinds: the periods.
  local steps = (short + -short % rate) / rate
  if cfg[c + KIND] ~= GREEDY then
    return stamp + steps * cfg[c + PERIOD] - now
  end
  if stamp > now then
    return steps + stamp - now
  end
  return steps
end

-- minLevel is the lowest level reservations may take bandwidth i to.
local function minLevel(i)
  local c = 8 * i
  local f, rate = cfg[c + CAP] * cfg[c + SCALE], cfg[c + RATE]
  local debt = MAX_HORIZON * rate
  if cfg[c + KIND] ~= GREEDY then
    local period = cfg[c + PERIOD]
    debt = (MAX_HORIZON - MAX_HORIZON % period) / period * rate
  end
  if debt >= f + MAX_SCALED then
    return -MAX_SCALED
  end
  return f - debt
end

-- The stored state keeps a bandwidth's level as whole tokens and the
-- scaled units left over, which is what a config change carries over and
-- takes fewer bytes than the level and the scale. old holds, from old[4], 5
-- fields per bandwidth: bandwidth j's field F is old[5 * j + F].

local OLD_CAP, OLD_TOKENS, OLD_FRACTION, OLD_BACK, OLD_ID = -1, 0, 1, 2, 3

-- PAIRS[w] is struct's format for an unsigned and a signed integer of w
-- bytes, spelled out: building it from w would format w with sprintf.
local PAIRS = {'I1i1', 'I2i2', 'I3i3', 'I4i4', 'I5i5', 'I6i6', 'I7i7'}

-- decodeState returns the bandwidth count, fingerprint, expiry and fields
-- of the state in v, or nothing if v is not a well-formed state.
local function decodeState(v)
  local n = byte(v, 1) - FORMAT + 1
  -- From the fingerprint on: it, the expiry, the width bytes skipped, then
  -- each bandwidth.
  local format = '<c8I7x'
  if n > 1 then
    format = format .. rep('x', n - 1)
  end
  for j = 1, n do
    local w = byte(v, 16 + j) or 0
    local wf = w % 16
    local wt = (w - wf) / 16
    if wt < 1 or wt > 7 or wf < 1 or wf > 7 then
      return
    end
    format = format .. PAIRS[wt] .. PAIRS[wf] .. 'Bc0'
  end
  local old = {pcall(struct.unpack, format, v, 2)}
  if not old[1] or old[#old] ~= #v + 1 then
    return
  end
  for j = 1, n do
    local cap, tokens = old[5 * j + OLD_CAP], old[5 * j + OLD_TOKENS]
    if cap < 1 or cap > 2 ^ 50 or tokens > cap or tokens < -MAX_SCALED or old[5 * j + OLD_FRACTION] >= MAX_SCALED then
      return
    end
  end
  return n, old[2], old[3], old
end

-- width is the fewest bytes (1 to 7) that hold the unsigned u and, in two's
-- complement, the signed s.
local function width(u, s)
  if s < 0 then
    s = -s - 1
  end
  s = 2 * s
  if s > u then
    u = s
  end
  local w, limit = 1, 256
  while u >= limit do
    w, limit = w + 1, limit * 256
  end
  return w
end

-- encodeState packs the state of cfg's bandwidths, at level and stamp, to
-- expire at exp; nil if a field is out of range.
local function encodeState(level, stamp, exp)
  local format = '<Bc8I7B'
  if count > 1 then
    format = format .. rep('B', count - 1)
  end
  -- Sized for one bandwidth; more grow it.
  local fields = {FORMAT + count - 1, fp, exp, 0, 0, 0, 0, 0, 0, 0}
  for i = 1, count do
    local c = 8 * i
    local cap, scale = cfg[c + CAP], cfg[c + SCALE]
    local fraction = level[i] % scale
    local tokens, back = (level[i] - fraction) / scale, exp - stamp[i]
    local wt, wf = width(cap, tokens), width(fraction, back)
    if wt > 7 or wf > 7 then
      return nil -- only a corrupt state read earlier gets here
    end
    fields[3 + i] = 16 * wt + wf
    format = format .. PAIRS[wt] .. PAIRS[wf] .. 'Bc0'
    local at = 3 + count + 6 * (i - 1)
    fields[at + 1], fields[at + 2], fields[at + 3], fields[at + 4], fields[at + 5], fields[at + 6] =
      cap, tokens, fraction, back, #cfg[c + ID], cfg[c + ID]
  end
  return struct.pack(format, unpack(fields, 1, 3 + 7 * count))
end

-- Apply, as in ratelimit/tokenbucket.go.

local raw = redis.call('GET', KEYS[1])
local n, oldFp, exp, old
if raw then
  local head = byte(raw, 1)
  if head < FORMAT or head >= FORMAT + 16 then
    return redis.error_reply('sluice: key ' .. KEYS[1] .. ' holds a value sluice did not write')
  end
  n, oldFp, exp, old = decodeState(raw)
  if n == nil then
    return redis.error_reply('sluice: corrupt state at key ' .. KEYS[1])
  end
end

-- level[i] and stamp[i] are bandwidth i's state, built for cfg.
local level, stamp = {}, {}
if not raw or op == RESET or now >= exp then
  for i = 1, count do
    level[i], stamp[i] = cfg[8 * i + INITIAL] * cfg[8 * i + SCALE], periodStart(i, now)
  end
elseif op == REPLACE or oldFp ~= fp or n ~= count then
  -- A config change: the functions it needs are made only here.

  -- mulDivFloor is floor(a*b/c) for 1 <= b, c <= 2^50 and |a| <= 2^52,
  -- exact, saturating at ±2^53 where the result passes 2^52 (the caller
  -- clamps it to less than that).
  local function mulDivFloor(a, b, c)
    local neg = a < 0
    if neg then
      a = -a
    end
    local whole = (a - a % c) / c
    if whole > 0 and whole > 2 ^ 52 / b then
      return neg and -SATURATED or SATURATED
    end
    -- a*b = whole*b*c + part*b; part*b/c by binary long multiplication,
    -- keeping the remainder below c so that nothing passes 2^52.
    local part = a - whole * c
    local q, r = 0, 0
    for k = 51, 0, -1 do
      q, r = q * 2, r * 2
      if r >= c then
        q, r = q + 1, r - c
      end
      if b % 2 ^ (k + 1) >= 2 ^ k then
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

  -- match finds the old bandwidth that bandwidth i inherits from: the one
  -- with its ID, or with no ID at its position.
  local function match(i)
    local id = cfg[8 * i + ID]
    if id == '' then
      if old[5 * i + OLD_ID] == '' then
        return i
      end
      return nil
    end
    for j = 1, n do
      if old[5 * j + OLD_ID] == id then
        return j
      end
    end
    return nil
  end

  for i = 1, count do
    local c = 8 * i
    local scale = cfg[c + SCALE]
    level[i], stamp[i] = cfg[c + INITIAL] * scale, periodStart(i, now)
    local j = match(i)
    if strategy ~= RESET_TOKENS and j then
      local o = 5 * j
      local t = old[o + OLD_TOKENS]
      local oldCap, newCap = old[o + OLD_CAP], cfg[c + CAP]
      if strategy == PROPORTIONALLY then
        t = mulDivFloor(t, newCap, oldCap)
      elseif t > newCap then
        t = newCap
      end
      if strategy == ADDITIVE and newCap > oldCap then
        t = t + newCap - oldCap
      end
      local least = minLevel(i)
      least = (least + -least % scale) / scale
      if t < least then
        t = least
      end
      level[i] = t * scale
      stamp[i] = periodStart(i, exp - old[o + OLD_BACK])
    end
  end
else
  for i = 1, count do
    local o, cap, scale = 5 * i, cfg[8 * i + CAP], cfg[8 * i + SCALE]
    local fraction = old[o + OLD_FRACTION]
    local l = old[o + OLD_TOKENS] * scale + fraction
    if old[o + OLD_CAP] ~= cap or fraction >= scale or l > cap * scale or l < -MAX_SCALED then
      return redis.error_reply('sluice: corrupt state at key ' .. KEYS[1])
    end
    level[i], stamp[i] = l, exp - old[o + OLD_BACK]
  end
end

-- Refill.
for i = 1, count do
  local c = 8 * i
  local f = cfg[c + CAP] * cfg[c + SCALE]
  local elapsed = now - stamp[i]
  if elapsed > 0 then
    if level[i] >= f then
      stamp[i] = periodStart(i, now)
    elseif cfg[c + KIND] == GREEDY then
      if elapsed * cfg[c + RATE] >= f - level[i] then
        level[i] = f
      else
        level[i] = level[i] + elapsed * cfg[c + RATE]
      end
      stamp[i] = now
    else
      local period, rate, short = cfg[c + PERIOD], cfg[c + RATE], f - level[i]
      local periods = (elapsed - elapsed % period) / period
      if periods >= (short + -short % rate) / rate then
        level[i], stamp[i] = f, periodStart(i, now)
      elseif periods > 0 then
        level[i] = level[i] + periods * rate
        stamp[i] = stamp[i] + periods * period
      end
    end
  end
end

-- waitFor is the µs until every bandwidth holds t tokens, and the
-- bandwidth that takes longest.
local function waitFor(t)
  local wait, slowest = 0, 1
  for i = 1, count do
    local w = timeTo(i, level[i], stamp[i], t * cfg[8 * i + SCALE])
    if w > wait then
      wait, slowest = w, i
    end
  end
  return wait, slowest
end

local function take(t)
  for i = 1, count do
    level[i] = level[i] - t * cfg[8 * i + SCALE]
  end
end

-- whole is the whole tokens in l scaled units, none when in debt.
local function whole(l, scale)
  if l <= 0 then
    return 0
  end
  return (l - l % scale) / scale
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
    local r = whole(level[i], cfg[8 * i + SCALE])
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
    if level[i] == f and now > stamp[i] then
      stamp[i] = periodStart(i, now)
    end
  end
end

-- Settle: the binding bandwidth (the one with the fewest tokens left unless
-- a denial named one), the time to full, and the expiry.
local resetAfter, least, left = 0, SATURATED, 0
for i = 1, count do
  local r = whole(level[i], cfg[8 * i + SCALE])
  if allowed == 1 and r < least then
    least, binding = r, i
  end
  if i == binding then
    left = r
  end
  local w = timeTo(i, level[i], stamp[i], cfg[8 * i + CAP] * cfg[8 * i + SCALE])
  if w > resetAfter then
    resetAfter = w
  end
end
local warmup = 0
for i = 1, count do
  local c = 8 * i
  if cfg[c + INITIAL] ~= cfg[c + CAP] then
    local w = timeTo(i, cfg[c + INITIAL] * cfg[c + SCALE], periodStart(i, now), cfg[c + CAP] * cfg[c + SCALE])
    if w > warmup then
      warmup = w
    end
  end
end

-- On the server's clock the key expires (PXAT) at the end of the whole
-- second in which the state comes to equal a new bucket's. Keys so linger
-- up to a second longer than they must, but a call that leaves the expiry
-- within the second of the stored state's keeps the key's TTL (KEEPTTL),
-- which costs Redis half as much as setting one. A caller's clock need not
-- keep pace with the server's, so with one the key lives a minute longer
-- than its expiry on that clock; the expiry in the state still decides.
local expiry = now + resetAfter + warmup
if expiry <= now then
  redis.call('DEL', KEYS[1])
else
  local v = encodeState(level, stamp, expiry)
  if v == nil then
    return redis.error_reply('sluice: corrupt state at key ' .. KEYS[1])
  end
  if clockGiven then
    local ms = expiry - now
    redis.call('SET', KEYS[1], v, 'PX', (ms + -ms % 1000) / 1000 + GRACE)
  elseif raw and expiry <= exp + -exp % 1000000 then
    redis.call('SET', KEYS[1], v, 'KEEPTTL')
  else
    redis.call('SET', KEYS[1], v, 'PXAT', (expiry + -expiry % 1000000) / 1000)
  end
end
return {allowed, consumed, cfg[8 * binding + CAP], left, retry, resetAfter, binding - 1}
