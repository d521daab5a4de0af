-- sluice token bucket: run is one atomic decision on the call's bucket.
--
-- This is ratelimit's applyBucket (ratelimit/tokenbucket.go) in Lua; the two
-- must agree to the microsecond and the scaled unit, and the tests of
-- internal/redisscript compare them state for state. Read Apply's comments
-- for the why of each rule; the comments here are about Lua.
--
-- The stored value is prelude.lua's layout, whose pairs per bandwidth are
-- (capacity, level in scaled units) and (scale, expiry - stamp). Keeping
-- capacity, scale and ID lets the script convert the bucket when the
-- config's fingerprint changes, the exact level included.
--
-- Values in LEGACY_FORMAT's formats are the layout before this one, whose
-- pairs are (capacity, whole tokens) and (fraction: the rest of the level,
-- in scaled units, expiry - stamp): the script reads them, with the scale
-- of the request's config when the bucket was built for it, and else as
-- whole tokens (the old scale is not stored), and writes them back in this
-- layout.

local MAX_SCALED = 2 ^ 51
local MAX_HORIZON = 2 ^ 51

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

local OLD_CAP, OLD_LEVEL, OLD_SCALE, OLD_BACK = OLD_U1, OLD_S1, OLD_U2, OLD_S2

-- upgrade rewrites the n bandwidths' fields of a legacy state, old, as
-- this layout's: (capacity, tokens), (fraction, back) becomes (capacity,
-- tokens × scale + fraction), (scale, back) with the scale of cfg when
-- built says the state was built for it, or (capacity, tokens), (1, back).
-- It returns false for a fraction that is not less than its scale.
local function upgrade(old, n, built)
  for j = 1, n do
    local o = 5 * j
    local tokens, fraction, scale = old[o + OLD_LEVEL], old[o + OLD_SCALE], 1
    if built then
      scale = cfg[8 * j + SCALE]
      if fraction >= scale then
        return false
      end
      old[o + OLD_LEVEL] = tokens * scale + fraction
    end
    old[o + OLD_SCALE] = scale
  end
  return true
end

-- level[i] and stamp[i] are bandwidth i's state during a call, built for
-- cfg: every call sets them for its bandwidths before it reads them, so a
-- library's calls share the two tables.
local level, stamp = {}, {}

-- bandWait is the µs until bandwidth i holds t tokens.
local function bandWait(i, t)
  return timeTo(i, level[i], stamp[i], t * cfg[8 * i + SCALE])
end

-- waitFor is the µs until every bandwidth holds t tokens, and the
-- bandwidth that takes longest.
local function waitFor(t)
  local wait, slowest = 0, 1
  for i = 1, count do
    local w = bandWait(i, t)
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

-- room is the whole tokens bandwidth i holds, none when in debt.
local function room(i)
  local l, scale = level[i], cfg[8 * i + SCALE]
  if l <= 0 then
    return 0
  end
  return (l - l % scale) / scale
end

-- lend: Reserve takes on credit down to each bandwidth's debt limit.
local function lend(t)
  for i = 1, count do
    if level[i] - t * cfg[8 * i + SCALE] < minLevel(i) then
      return false
    end
  end
  return true
end

-- run is applyBucket, as in ratelimit/tokenbucket.go.
local function run()
  local raw, n, oldFp, exp, old, legacy = readState()
  if raw == nil then
    return n -- the error
  end
  if legacy and not upgrade(old, n, oldFp == fp and n == count) then
    return corrupt()
  end
  if raw then
    for j = 1, n do
      local o = 5 * j
      local cap, l, scale = old[o + OLD_CAP], old[o + OLD_LEVEL], old[o + OLD_SCALE]
      if cap < 1 or cap > 2 ^ 50 or scale < 1 or cap * scale > MAX_SCALED or l > cap * scale or l < -MAX_SCALED then
        return corrupt()
      end
    end
  end

  if not raw or op == RESET or now >= exp then
    for i = 1, count do
      level[i], stamp[i] = cfg[8 * i + INITIAL] * cfg[8 * i + SCALE], periodStart(i, now)
    end
  elseif op == REPLACE or oldFp ~= fp or n ~= count then
    -- A config change.
    for i = 1, count do
      local c = 8 * i
      local scale = cfg[c + SCALE]
      level[i], stamp[i] = cfg[c + INITIAL] * scale, periodStart(i, now)
      local j = match(i, old, n)
      if strategy ~= RESET_TOKENS and j then
        local o = 5 * j
        local least = minLevel(i)
        level[i] = inherit(old[o + OLD_LEVEL], old[o + OLD_SCALE], old[o + OLD_CAP], cfg[c + CAP], scale,
          (least + -least % scale) / scale)
        stamp[i] = periodStart(i, exp - old[o + OLD_BACK])
      end
    end
  else
    for i = 1, count do
      local o = 5 * i
      if old[o + OLD_CAP] ~= cfg[8 * i + CAP] or old[o + OLD_SCALE] ~= cfg[8 * i + SCALE] then
        return corrupt()
      end
      level[i], stamp[i] = old[o + OLD_LEVEL], exp - old[o + OLD_BACK]
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

  local allowed, consumed, retry, binding = 1, 0, 0, 0
  if op ~= ADD and op ~= RESET and op ~= REPLACE then
    allowed, consumed, retry, binding = decide(waitFor, room, take, lend)
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

  -- Settle: the binding bandwidth and its next token, the time to full,
  -- and the expiry.
  local left
  binding, left = bindingOf(allowed, binding, room)
  local refill = refillAfter(binding, left, bandWait)
  local resetAfter = 0
  for i = 1, count do
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

  local expiry = now + resetAfter + warmup
  -- The stored pairs: capacity and level, scale and the distance from the
  -- stamp to the expiry.
  for i = 1, count do
    local c = 8 * i
    packed[4 * i - 3], packed[4 * i - 2], packed[4 * i - 1], packed[4 * i] =
      cfg[c + CAP], level[i], cfg[c + SCALE], expiry - stamp[i]
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

-- The fast path: a Consume on one greedy bandwidth that starts full, with
-- no ID, on an unversioned config, on a bucket of this config or none.
-- It is run's math for that case alone, on locals instead of the call's
-- tables: the same decisions and the same stored bytes, which the tests
-- that compare the scripts with ratelimit.Apply check along with run's.
-- Anything else (another state, a value that fails run's checks, a
-- decision out of range) it leaves to run, which decides it or refuses it.
-- It costs the server about 60% of run's instructions (docs/redis.md).
-- The fingerprint is read as two 4-byte numbers, not a string: Lua makes
-- a string at a cost of thousands of instructions.
local FAST_REQUEST = '<I4I4BddBdBBBddddddBd'
local FAST_LENGTH = 36 + 1 + 6 * 8 + 1 + 8 -- one bandwidth, no ID
local fastDecode, fastEncode = {}, {} -- by width byte: at most 49 each

-- fastTimeTo is timeTo for the fast path: the µs until a greedy bandwidth
-- of rate whose stamp is ahead µs after now gains short scaled units.
local function fastTimeTo(short, rate, ahead)
  if short <= 0 then
    return 0
  end
  local steps = (short + -short % rate) / rate
  if ahead > 0 then
    return steps + ahead
  end
  return steps
end

local function fast(keys, args)
  local a = args[1]
  if #a ~= FAST_LENGTH then
    return nil
  end
  local fp1, fp2, o, t, _, _, now, n, alg, kind, cap, scale, rate, _, initial, _, _, version = struct.unpack(FAST_REQUEST, a)
  if o ~= CONSUME or n ~= 1 or alg ~= 0 or kind ~= GREEDY or initial ~= cap or version ~= 0 then
    return nil
  end
  local k = keys[1]
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    return nil
  end
  local given
  given, now = clock(now)
  local f = cap * scale
  local level, stamp, kept = f, now, nil
  if v then
    -- A state of one bandwidth with no ID, its pairs w1 and w2 bytes
    -- wide, is 18 + 2·w1 + 2·w2 bytes long; of that length, it unpacks.
    local w = string.byte(v, 17) or 0
    local format = fastDecode[w]
    if not format then
      local w2 = w % 16
      local w1 = (w - w2) / 16
      if w1 < 1 or w1 > 7 or w2 < 1 or w2 > 7 then
        return nil
      end
      format = {'<BI4I4I7x' .. PAIRS[w1] .. PAIRS[w2] .. 'B', 18 + 2 * w1 + 2 * w2}
      fastDecode[w] = format
    end
    if #v ~= format[2] then
      return nil
    end
    local head, f1, f2, exp, c, l, sc, back, id = struct.unpack(format[1], v)
    if head ~= TOKEN_BUCKET_FORMAT or f1 ~= fp1 or f2 ~= fp2 or id ~= 0 or c ~= cap or sc ~= scale or f > MAX_SCALED or
      l > f or l < -MAX_SCALED then
      return nil
    end
    kept = exp
    if now < exp then
      level, stamp = l, exp - back
    end
  end
  -- Refill.
  local elapsed = now - stamp
  if elapsed > 0 then
    if level < f then
      if elapsed * rate >= f - level then
        level = f
      else
        level = level + elapsed * rate
      end
    end
    stamp = now
  end
  local ahead = stamp - now
  local allowed, consumed, retry = 1, 0, fastTimeTo(t * scale - level, rate, ahead)
  if retry == 0 then
    level, consumed = level - t * scale, t
  else
    allowed = 0
  end
  local left = 0
  if level > 0 then
    left = (level - level % scale) / scale
  end
  local refill = 0
  if left < cap then
    refill = fastTimeTo((left + 1) * scale - level, rate, ahead)
  end
  local reset = fastTimeTo(f - level, rate, ahead)
  if not (left <= cap and retry < SATURATED and reset < SATURATED and refill <= reset) then
    return nil
  end
  -- reset > 0: a Consume either takes tokens or finds fewer than it
  -- asks, so the bucket is not full and the key is written, never deleted.
  local expiry = now + reset
  local back = expiry - stamp
  local w1, w2 = width(cap, level), width(scale, back)
  if w1 > 7 or w2 > 7 or level % 1 ~= 0 or back % 1 ~= 0 then
    return nil
  end
  local w = 16 * w1 + w2
  local format = fastEncode[w]
  if not format then
    format = '<BI4I4I7B' .. PAIRS[w1] .. PAIRS[w2] .. 'B'
    fastEncode[w] = format
  end
  v = struct.pack(format, TOKEN_BUCKET_FORMAT, fp1, fp2, expiry, w, cap, level, scale, back, 0)
  setState(k, v, expiry, now, given, kept)
  return {allowed, consumed, cap, left, retry, reset, refill, 0}
end
