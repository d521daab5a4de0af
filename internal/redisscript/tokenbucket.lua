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
    allowed, consumed, retry, binding = decide(bandWait, room, take, lend)
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

-- The fast path: a Consume on one or two greedy bandwidths that start
-- full, on an unversioned config, on a bucket of this config or none. It
-- is run's math for that case alone, on locals instead of the call's
-- tables: the same decisions and the same stored bytes, which the tests
-- that compare the scripts with ratelimit.Apply check along with run's,
-- and TestFastPathMatchesApply on the fast path alone. Anything else
-- (another state, a value that fails run's checks, a decision out of
-- range) it leaves to run, which decides it or refuses it.
--
-- It is written for the instructions Redis runs (docs/redis.md): a call
-- of a C function (struct's, string's, redis's) costs about a thousand,
-- so it makes eight for one bandwidth (unpacking the request, GET, TIME,
-- unpacking the state's head and its pairs, packing the state, SET, and
-- packing the reply) and two more for a second; a Lua call costs a few
-- hundred and a Lua operation about fifty, so a bandwidth's math is in
-- functions of its fields, called a few times a bandwidth, and the
-- call's fields are locals, not tables. The fingerprint is read as two
-- 4-byte numbers, not a string: Lua makes a string at a cost of
-- thousands of instructions. A state of the request's fingerprint is of
-- the request's config, IDs included, so only its length, not its IDs,
-- is compared.
local FAST_REQUEST, FAST_BAND = '<I4I4BddBdBBBddddddBc0d', '<BddddddBc0d'
local FAST_LENGTH = {36 + 50 + 8, 36 + 2 * 50 + 8} -- by bandwidth count, IDs aside
-- A state's head as the fast path reads it: format byte, fingerprint,
-- expiry and width bytes, by bandwidth count.
local FAST_HEAD = {'<BI4I4I7B', '<BI4I4I7BB'}
-- fastPairs[w] is the struct format of a bandwidth's two pairs whose
-- width byte is w and their length in bytes: {format, length}; nil for a
-- width byte no state has. fastEncode[shape] is the format of a state of
-- one or two bandwidths whose width bytes make shape (the first's, plus
-- 256 times the second's), built when first met (at most 49 + 49²).
local fastPairs, fastEncode = {}, {}
for w1 = 1, 7 do
  for w2 = 1, 7 do
    fastPairs[16 * w1 + w2] = {'<' .. PAIRS[w1] .. PAIRS[w2], 2 * w1 + 2 * w2}
  end
end
-- The C functions the fast path calls, fetched on its first call: a
-- library's top level runs without the standard library.
local unpackFast, packFast

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

-- fastRefill returns a greedy bandwidth of f scaled units full and rate,
-- at level and stamp, brought up to now: its level and stamp, and the µs
-- until it holds need scaled units (found without a call when it holds
-- them already, as a Consume that is allowed does).
local function fastRefill(f, rate, level, stamp, need, now)
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
  local short = need - level
  if short <= 0 then
    return level, stamp, 0
  end
  return level, stamp, fastTimeTo(short, rate, stamp - now)
end

-- fastSettle returns the whole tokens a greedy bandwidth at level and
-- stamp holds, and the µs until it is full.
local function fastSettle(cap, scale, rate, level, stamp, now)
  local left = 0
  if level > 0 then
    left = (level - level % scale) / scale
  end
  return left, fastTimeTo(cap * scale - level, rate, stamp - now)
end

-- fastWidth is the width byte of a bandwidth's stored pairs, (cap, level)
-- and (scale, back); nil if they do not fit.
local function fastWidth(cap, level, scale, back)
  local w1, w2 = width(cap, level), width(scale, back)
  if w1 > 7 or w2 > 7 then
    return nil
  end
  return 16 * w1 + w2
end

local function fast(keys, args)
  local a = args[1]
  if not unpackFast then
    unpackFast, packFast = struct.unpack, struct.pack
  end
  -- Bandwidth i's capacity, scale, rate, initial tokens, refill kind and
  -- ID are cap<i>, scale<i>, rate<i>, init<i>, kind<i> and id<i>. Every
  -- request holds a bandwidth and 8 bytes after it: the version, or the
  -- second bandwidth's first, whose fields the second unpack then reads
  -- from there (at rest, 8 bytes before).
  local fp1, fp2, o, t, _, _, now, n, alg, kind1, cap1, scale1, rate1, _, init1, _, id1, version, rest =
    unpackFast(FAST_REQUEST, a)
  local cap2, scale2, rate2, init2, kind2, id2
  if n == 2 then
    kind2, cap2, scale2, rate2, _, init2, _, id2, version = unpackFast(FAST_BAND, a, rest - 8)
    if kind2 ~= GREEDY or init2 ~= cap2 then
      return nil
    end
  elseif n ~= 1 then
    return nil
  end
  if #a ~= FAST_LENGTH[n] + #id1 + #(id2 or '') or o ~= CONSUME or alg ~= 0 or version ~= 0 or kind1 ~= GREEDY or
    init1 ~= cap1 then
    return nil
  end
  local k = keys[1]
  -- GET's reply: the state, false for none, or an error table (the key
  -- holds another type), whose err field a string lacks.
  local v = redis.pcall('GET', k)
  if v and v.err then
    return nil
  end
  local given, kept
  given, now = clock(now)
  local f1, f2 = cap1 * scale1, 0
  if n == 2 then
    f2 = cap2 * scale2
  end
  local level1, stamp1, level2, stamp2 = f1, now, f2, now
  if v then
    -- A state of this config: its head, then each bandwidth's pairs, in
    -- the widths its width bytes say, its ID's length and its ID, of
    -- the request's length (the fingerprint covers the IDs). Of that
    -- length, every unpack reads within it.
    if #v < 17 + n then
      return nil
    end
    -- (For one bandwidth, w2 is unpack's next position.)
    local head, h1, h2, exp, w1, w2 = unpackFast(FAST_HEAD[n], v)
    local p1, p2 = fastPairs[w1], nil
    if head ~= TOKEN_BUCKET_FORMAT + n - 1 or h1 ~= fp1 or h2 ~= fp2 or not p1 then
      return nil
    end
    local size = 17 + n + p1[2] + #id1
    if n == 2 then
      p2 = fastPairs[w2]
      if not p2 then
        return nil
      end
      size = size + p2[2] + 1 + #id2
    end
    if #v ~= size then
      return nil
    end
    local c1, l1, sc1, b1 = unpackFast(p1[1], v, 17 + n)
    if c1 ~= cap1 or sc1 ~= scale1 or f1 > MAX_SCALED or l1 > f1 or l1 < -MAX_SCALED then
      return nil
    end
    local c2, l2, sc2, b2
    if n == 2 then
      c2, l2, sc2, b2 = unpackFast(p2[1], v, 20 + p1[2] + #id1)
      if c2 ~= cap2 or sc2 ~= scale2 or f2 > MAX_SCALED or l2 > f2 or l2 < -MAX_SCALED then
        return nil
      end
    end
    kept = exp
    if now < exp then
      level1, stamp1 = l1, exp - b1
      if n == 2 then
        level2, stamp2 = l2, exp - b2
      end
    end
  end
  -- Refill, and the wait for t tokens: the longest of the bandwidths'.
  local wait, wait2, slowest
  level1, stamp1, wait = fastRefill(f1, rate1, level1, stamp1, t * scale1, now)
  slowest = 1
  if n == 2 then
    level2, stamp2, wait2 = fastRefill(f2, rate2, level2, stamp2, t * scale2, now)
    if wait2 > wait then
      wait, slowest = wait2, 2
    end
  end
  local allowed, consumed = 0, 0
  if wait == 0 then
    allowed, consumed = 1, t
    level1, level2 = level1 - t * scale1, level2 - t * (scale2 or 0)
  end
  -- Settle: the binding bandwidth (when allowed, the one with the fewest
  -- whole tokens left, the first of equals), its next token, and the time
  -- to full.
  local left, reset = fastSettle(cap1, scale1, rate1, level1, stamp1, now)
  local binding, cap, scale, rate, level, stamp = 1, cap1, scale1, rate1, level1, stamp1
  if n == 2 then
    local left2, reset2 = fastSettle(cap2, scale2, rate2, level2, stamp2, now)
    if reset2 > reset then
      reset = reset2
    end
    if allowed == 1 and left2 < left or allowed == 0 and slowest == 2 then
      left, binding, cap, scale, rate, level, stamp = left2, 2, cap2, scale2, rate2, level2, stamp2
    end
  end
  local refill = 0
  if left < cap then
    refill = fastTimeTo((left + 1) * scale - level, rate, stamp - now)
  end
  if not (left <= cap and wait < SATURATED and reset < SATURATED and refill <= reset) then
    return nil
  end
  -- reset > 0: a Consume either takes tokens or finds fewer than it asks,
  -- so the bucket is not full and the key is written, never deleted.
  local expiry = now + reset
  local w1 = fastWidth(cap1, level1, scale1, expiry - stamp1)
  if not w1 then
    return nil
  end
  local shape, w2 = w1, nil
  if n == 2 then
    w2 = fastWidth(cap2, level2, scale2, expiry - stamp2)
    if not w2 then
      return nil
    end
    shape = w1 + 256 * w2
  end
  local format = fastEncode[shape]
  if not format then
    format = '<BI4I4I7' .. string.rep('B', n) .. bandFormat(w1)
    if n == 2 then
      format = format .. bandFormat(w2)
    end
    fastEncode[shape] = format
  end
  if n == 1 then
    v = packFast(format, TOKEN_BUCKET_FORMAT, fp1, fp2, expiry, w1, cap1, level1, scale1, expiry - stamp1, #id1, id1)
  else
    v = packFast(format, TOKEN_BUCKET_FORMAT + 1, fp1, fp2, expiry, w1, w2, cap1, level1, scale1, expiry - stamp1,
      #id1, id1, cap2, level2, scale2, expiry - stamp2, #id2, id2)
  end
  setState(k, v, expiry, now, given, kept)
  return packFast(REPLY, allowed, consumed, cap, left, wait, reset, refill, binding - 1)
end
