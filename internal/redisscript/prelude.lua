-- sluice script prelude: what every script shares. The Go code puts it
-- before the algorithms' files, each of which defines its decision as the
-- function run, and makes of them either one Redis Functions library
-- (FUNCTION LOAD: this chunk and every algorithm's file run once, and each
-- FCALL runs only the algorithm's fast path, and if that does not answer,
-- begin and its run) or one script per algorithm (EVALSHA: the prelude,
-- the algorithm's file, then the same, all on every call). The locals here
-- are the algorithms' too.
--
-- The per-call state is in locals of this chunk, which begin sets from the
-- call's key and argument: Redis runs one script or function at a time, so
-- no two calls share them, and a library keeps its helpers, caches and
-- tables from call to call instead of making them again.
--
-- The call's argument is the request, packed by NewCall in call.go
-- (little-endian):
--   c8 fingerprint, B op, d tokens, d max wait (µs), B strategy,
--   d now (µs; negative: the server's TIME, less -1 - now µs: a request's
--   Ago), B bandwidth count,
--   B algorithm, then per bandwidth: B refill kind, d capacity, d scale,
--   d rate, d period (µs), d initial tokens, d aligned start (µs), B ID
--   length, c ID; then d config version.
--
-- The reply is one string, packed as REPLY says (call.go's Decision
-- decodes it): allowed (1 or 0), then consumed, limit, remaining, retry
-- after (µs), reset after (µs) and refill after (µs) as doubles, then the
-- binding bandwidth's index (0-based). Redis turns a table a script
-- returns into its reply at a cost of about a thousand instructions an
-- element; a string costs a fraction of that, and packing it less than
-- the table it replaces.
--
-- Lua numbers are doubles. Every integer here stays within 2^53, where
-- doubles are exact (ratelimit.Config.Validate bounds the inputs for that),
-- and every division rounds exactly (see below). Products that could pass
-- 2^53 are only compared, never stored: a rounded product that reaches 2^53
-- is still larger than anything it is compared with.
--
-- The scripts run for every decision, so they are written for Redis's Lua,
-- where (counted with callgrind on redis-server 7.0.15) a function call,
-- Lua or C, costs about ten times an arithmetic operation, and a table,
-- string or closure made costs a few thousand instructions. Hence:
--
--   - data lives in a handful of flat arrays indexed by bandwidth, and
--     every algorithm's helpers but the sliding log's (which close over
--     its run's locals) are defined outside run, so that a library makes
--     them once, not per call;
--   - a request's struct format is built once per bandwidth count and kept;
--   - floor(a/b), for b > 0, is written (a - a % b) / b and ceil(a/b) as
--     (a + -a % b) / b: % is an operation, math.floor a call. Both are
--     exact for integers below 2^53: a % b is a - floor(a/b)·b, and a/b
--     rounded never crosses an integer (a quotient that is not whole lies
--     at least 1/b from one; rounding moves it by at most (a/b)·2^-53);
--   - min and max are comparisons, not calls.

local GREEDY, INTERVAL, ALIGNED = 0, 1, 2
local CONSUME, ESTIMATE, RESERVE, CONSUME_UP_TO, ADD, RESET, REPLACE, INSPECT = 0, 1, 2, 3, 4, 5, 6, 7
local RESET_TOKENS, PROPORTIONALLY, ADDITIVE = 1, 2, 3
local SATURATED = 2 ^ 53
local REPLY = '<BddddddB'
local GRACE = 60000 -- ms a key outlives its expiry on a caller's clock
local MAX_PERIOD = 366 * 24 * 3600 * 1000000 -- ratelimit.MaxRefillPeriod in µs

-- within reports whether x is a whole number in [0, hi]. Every comparison
-- is one a number in range passes, so NaN and the infinities fail.
local function within(x, hi)
  return x >= 0 and x <= hi and x % 1 == 0
end

-- A library's top level runs without the standard library (the code that
-- FUNCTION LOAD runs sees little more than the redis table), so begin
-- fetches these.
local byte, rep

-- The request: one unpack. cfg holds the header, then 8 fields per
-- bandwidth; bandwidth i's field F is cfg[8 * i + F].
local HEADER = '<c8BddBdBB' -- to the bandwidth count and algorithm: 36 bytes
local BAND = 'BddddddBc0'
local KIND, CAP, SCALE, RATE, PERIOD, INITIAL, START, ID = 1, 2, 3, 4, 5, 6, 7, 8

-- formats[n] is the struct format of a request of n bandwidths, built on
-- first use; a library keeps it for later calls.
local formats = {}
local function requestFormat(n)
  local f = formats[n]
  if not f then
    f = HEADER .. rep(BAND, n) .. 'd'
    formats[n] = f
  end
  return f
end

-- fast is an algorithm's fast path: the reply to a call of the common case
-- its file decides on its own, or nil for begin and run to decide. An
-- algorithm's file may define its own; this one has none.
local function fast() end

-- The call: its key and argument, the request unpacked from it, the clock.
local key, arg, cfg, count, fp, op, tokens, maxWait, strategy, now, algorithm, version, clockGiven

-- FORMAT is the first format byte of the algorithm's states (see below).
local FORMAT
local TOKEN_BUCKET_FORMAT, LEGACY_FORMAT = 112, 16

-- blob is the packed bandwidths of a versioned cfg, as a state keeps them:
-- the request's, or those adopted from the state. callerCfg and
-- callerCount keep the request's config once adopt has replaced it.
local blob, callerCfg, callerCount

-- clock returns whether the request gives the time, and the time to decide
-- at: the request's, or, for a negative now, the server's TIME less the
-- request's Ago (-1 - now µs).
local function clock(now)
  if now >= 0 then
    return true, now
  end
  local t = redis.call('TIME')
  return false, t[1] * 1000000 + t[2] + now + 1 -- Lua converts the strings
end

-- begin sets the call's state from keys[1], the bucket's key, and args[1],
-- the request, and reads the server's clock unless the request gives one.
local function begin(keys, args)
  byte, rep = string.byte, string.rep
  key, arg = keys[1], args[1]
  count = byte(arg, 35)
  cfg = {struct.unpack(requestFormat(count), arg)}
  fp, op, tokens, maxWait, strategy, now, algorithm = cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6], cfg[8]
  version = cfg[8 * count + 9]
  blob, callerCfg, callerCount = nil, nil, nil
  FORMAT = 16 * (algorithm + 1)
  if algorithm == 0 then
    FORMAT = TOKEN_BUCKET_FORMAT
  end
  clockGiven, now = clock(now)
end

-- The scripts that keep a bucket in a string share its layout (the tests
-- decode it in state_test.go):
--   B FORMAT + bandwidth count - 1, c8 fingerprint, I7 expiry (µs), then a
--   byte per bandwidth giving the widths of its fields (high nibble: of the
--   first pair; low nibble: of the second), then per bandwidth two pairs of
--   an unsigned and a signed integer, each pair in n bytes (1 to 7) as its
--   width byte says, then B ID length, c ID.
-- What the pairs hold is each algorithm's. Each algorithm has its own 16
-- formats, from 16 × (algorithm + 1), but for the token bucket's, from
-- TOKEN_BUCKET_FORMAT: a value in another algorithm's is a bucket whose
-- algorithm changed, and it starts afresh. The token bucket's formats moved
-- when its pairs changed; its earlier ones, from 16, are LEGACY_FORMAT's,
-- which it still reads (see tokenbucket.lua).
-- A state built for a versioned config (version above 0) has VERSIONED
-- added to its first byte, and after the bandwidths: I7 version, I2 length
-- and the config's bandwidths as the request packs them (see adopt).
local FORMATS_END, VERSIONED = 128, 128

-- PAIRS[w] is struct's format for an unsigned and a signed integer of w
-- bytes, spelled out: building it from w would format w with sprintf.
local PAIRS = {'I1i1', 'I2i2', 'I3i3', 'I4i4', 'I5i5', 'I6i6', 'I7i7'}

-- bandFormat is the struct format of a stored bandwidth whose width byte
-- is w (its two pairs, ID length and ID), and its length in bytes but the
-- ID's; nil for a width byte no state has. Formats are built once per
-- shape and kept, so this runs on a cache's miss, not on every call.
local function bandFormat(w)
  local w2 = w % 16
  local w1 = (w - w2) / 16
  if w1 < 1 or w1 > 7 or w2 < 1 or w2 > 7 then
    return nil
  end
  return PAIRS[w1] .. PAIRS[w2] .. 'Bc0', 2 * w1 + 2 * w2 + 1
end

-- A decoded state's fields: old[2] is the fingerprint, old[3] the expiry,
-- and bandwidth j's field F is old[5 * j + F].
local OLD_U1, OLD_S1, OLD_U2, OLD_S2, OLD_ID = -1, 0, 1, 2, 3

-- A library keeps the struct formats of the states it decodes and encodes,
-- by a number made of their width bytes and whether they are versioned
-- (versioned · 256^n + the width bytes, the first lowest: width bytes are
-- never 0, so keys of different counts differ), so that a call
-- on a state of a shape seen before builds no format. Formats of more
-- than SHAPED bandwidths, whose width bytes would not fit the number, are
-- built every time, and at most SHAPES formats are kept: garbage states
-- cannot grow the caches without bound.
local SHAPED, SHAPES = 6, 1024
local decodeFormats, encodeFormats, shapes = {}, {}, 0

-- keep stores format in cache at key, if the caches have room.
local function keep(cache, key, format)
  if key and shapes < SHAPES then
    cache[key], shapes = format, shapes + 1
  end
end

-- decodeState returns the bandwidth count, fingerprint, expiry, fields,
-- version and config of the state in v, or nothing if v is not shaped
-- like a state.
local function decodeState(v)
  local head = byte(v, 1)
  local n = head % 16 + 1
  local versioned = head >= VERSIONED
  -- The width bytes, checked, and the key they make.
  local key = versioned and 1 or 0
  for j = n, 1, -1 do
    local w = byte(v, 16 + j) or 0
    local w2 = w % 16
    local w1 = (w - w2) / 16
    if w1 < 1 or w1 > 7 or w2 < 1 or w2 > 7 then
      return
    end
    key = key * 256 + w
  end
  if n > SHAPED then
    key = nil
  end
  local format = key and decodeFormats[key]
  if not format then
    -- From the fingerprint on: it, the expiry, the width bytes skipped,
    -- then each bandwidth.
    format = '<c8I7x' .. rep('x', n - 1)
    for j = 1, n do
      format = format .. bandFormat(byte(v, 16 + j))
    end
    if versioned then
      format = format .. 'I7I2c0'
    end
    keep(decodeFormats, key, format)
  end
  local old = {pcall(struct.unpack, format, v, 2)}
  local last = #old
  if not old[1] or old[last] ~= #v + 1 then
    return
  end
  if versioned then
    return n, old[2], old[3], old, old[last - 2], old[last - 1]
  end
  return n, old[2], old[3], old, 0, nil
end

-- width is the fewest bytes (1 to 7) that hold the unsigned u and, in two's
-- complement, the signed s; 8 if none do. Comparisons, not a loop: a state
-- is encoded on every call. A NaN fails every comparison, so it gets 8.
local function width(u, s)
  if s < 0 then
    s = -s - 1
  end
  s = 2 * s
  if s > u then
    u = s
  end
  if u < 2 ^ 24 then
    if u < 2 ^ 8 then
      return 1
    elseif u < 2 ^ 16 then
      return 2
    end
    return 3
  elseif u < 2 ^ 40 then
    if u < 2 ^ 32 then
      return 4
    end
    return 5
  elseif u < 2 ^ 48 then
    return 6
  elseif u < 2 ^ 56 then
    return 7
  end
  return 8
end

-- bands returns blob, cut from the request when not yet adopted.
local function bands()
  if not blob then
    blob = string.sub(arg, 37, -9)
  end
  return blob
end

-- packed is the pairs an algorithm hands encodeState, and fields what
-- encodeState hands struct.pack: tables of the library's, which every call
-- fills as far as it reads them.
local packed, fields = {}, {}

-- encodeState packs the state of cfg's bandwidths to expire at exp, where
-- bandwidth i's pairs are (p[4i-3], p[4i-2]) and (p[4i-1], p[4i]); nil if a
-- field is out of range.
local function encodeState(p, exp)
  local versioned = version > 0
  local head = FORMAT + count - 1
  if versioned then
    head = head + VERSIONED
  end
  fields[1], fields[2], fields[3] = head, fp, exp
  local key = versioned and 1 or 0
  for i = count, 1, -1 do
    local u1, s1, u2, s2 = p[4 * i - 3], p[4 * i - 2], p[4 * i - 1], p[4 * i]
    local w1, w2 = width(u1, s1), width(u2, s2)
    if w1 > 7 or w2 > 7 or not (u1 >= 0 and u2 >= 0 and u1 % 1 == 0 and u2 % 1 == 0 and s1 % 1 == 0 and s2 % 1 == 0) then
      return nil -- only a corrupt state read earlier gets here
    end
    local w = 16 * w1 + w2
    fields[3 + i], key = w, key * 256 + w
    local at, id = 3 + count + 6 * (i - 1), cfg[8 * i + ID]
    fields[at + 1], fields[at + 2], fields[at + 3], fields[at + 4], fields[at + 5], fields[at + 6] =
      u1, s1, u2, s2, #id, id
  end
  if count > SHAPED then
    key = nil
  end
  local format = key and encodeFormats[key]
  if not format then
    format = '<Bc8I7B' .. rep('B', count - 1)
    for i = 1, count do
      format = format .. bandFormat(fields[3 + i])
    end
    if versioned then
      format = format .. 'I7I2c0'
    end
    keep(encodeFormats, key, format)
  end
  local last = 3 + 7 * count
  if versioned then
    local b = bands()
    fields[last + 1], fields[last + 2], fields[last + 3] = version, #b, b
    last = last + 3
  end
  return struct.pack(format, unpack(fields, 1, last))
end

local function corrupt()
  return redis.error_reply('sluice: corrupt state at key ' .. key)
end

local function notSluice()
  return redis.error_reply('sluice: key ' .. key .. ' holds a value sluice did not write')
end

-- Forward-only versions: a call whose config is older than the live
-- bucket's is decided on the bucket's config, as ratelimit.Apply says
-- (ratelimit/version.go).

-- staleDenial is the reply to a stale call that the bucket's config
-- cannot decide: denied for StaleRetry, taking nothing.
local STALE_RETRY = 1000000
local function staleDenial()
  return struct.pack(REPLY, 0, 0, cfg[8 + CAP], 0, STALE_RETRY, STALE_RETRY, STALE_RETRY, 0)
end

-- validBands reports whether the n bandwidths of c, a config unpacked
-- from a state, are within the bounds ratelimit.Config.Validate sets, on
-- which the scripts' math relies. Only a value changed by hand fails.
local function validBands(c, n)
  for i = 1, n do
    local o = 8 * i
    local kind, cap, scale, rate, period = c[o + KIND], c[o + CAP], c[o + SCALE], c[o + RATE], c[o + PERIOD]
    if not ((kind == GREEDY or kind == INTERVAL or kind == ALIGNED) and within(period, MAX_PERIOD) and period >= 1 and
      within(rate, period) and rate >= 1 and within(scale, period) and scale >= 1 and within(cap, 2 ^ 50) and
      cap >= 1 and within(c[o + INITIAL], cap) and within(c[o + START], 2 ^ 52)) then
      return false
    end
  end
  return true
end

-- adopt makes the script decide on the config of the state read (its n
-- bandwidths packed in b, at version v, fingerprint f), keeping the
-- request's op, tokens, wait and strategy. It returns false if that config
-- cannot take the request (more tokens than its smallest capacity), and
-- nil if b is not n bandwidths within Validate's bounds (see validBands).
local function adopt(n, b, v, f)
  if n < 1 or n > 16 then
    return nil
  end
  local head = string.sub(arg, 1, 36)
  local adopted = {pcall(struct.unpack, HEADER .. rep(BAND, n), head .. b)}
  if not adopted[1] or adopted[#adopted] ~= #head + #b + 1 then
    return nil
  end
  table.remove(adopted, 1)
  if not validBands(adopted, n) then
    return nil
  end
  if op == CONSUME or op == ESTIMATE or op == RESERVE then
    for i = 1, n do
      if tokens > adopted[8 * i + CAP] then
        return false
      end
    end
  end
  callerCfg, callerCount = cfg, count
  cfg, count, blob, version, fp = adopted, n, b, v, f
  if op == REPLACE then
    op = INSPECT
  end
  return true
end

-- bandOut is the 0-based index the reply gives bandwidth i: the request's
-- bandwidth that matches it when the config was adopted (by ID, or by
-- position when neither has one; else the first).
local function bandOut(i)
  if not callerCfg then
    return i - 1
  end
  local id = cfg[8 * i + ID]
  for j = 1, callerCount do
    if callerCfg[8 * j + ID] == id and (id ~= '' or j == i) then
      return j - 1
    end
  end
  return 0
end

-- decision is the reply to a call (see the top of this file) whose
-- binding bandwidth, i in cfg, has left whole tokens; nil if it is not a
-- decision that Call.Decision in call.go accepts, which only a state
-- changed by hand gives. The scripts build it before they write, and reply
-- corrupt() instead, writing nothing: one key's damaged value is that
-- key's error, not a reply the client takes for a broken server.
local function decision(allowed, consumed, i, left, retry, reset, refill)
  local limit = cfg[8 * i + CAP]
  if not ((allowed == 0 or allowed == 1) and within(consumed, SATURATED) and within(limit, 2 ^ 50) and limit >= 1 and
    within(left, limit) and within(retry, SATURATED) and within(reset, SATURATED) and within(refill, reset)) then
    return nil
  end
  return struct.pack(REPLY, allowed, consumed, limit, left, retry, reset, refill, bandOut(i))
end

-- logMember is the fingerprint member of a sliding log (see slidinglog.lua)
-- for the current config: the fingerprint, and for a versioned config its
-- version, bandwidth count and packed bandwidths. logVersion decodes a
-- member's version, count and bandwidths (0 for an unversioned one).
local function logMember()
  if version > 0 then
    return fp .. struct.pack('<I7B', version, count) .. bands()
  end
  return fp
end

local function logVersion(m)
  if #m < 17 then
    return 0
  end
  local v, n = struct.unpack('<I7B', m, 9)
  return v, n, string.sub(m, 17)
end

-- logStateScore reports whether s, a score as ZRANGE gives it, is one the
-- sliding log gives a state member: -1 - x for a whole x in [0, 2^53).
local function logStateScore(s)
  local x = -1 - (tonumber(s) or 0)
  return x >= 0 and x < SATURATED and x % 1 == 0
end

-- slidingLog reports whether head, the first two members of a sorted set
-- with their scores (ZRANGE 0 1 WITHSCORES), are the state members that
-- slidinglog.lua keeps ahead of its tokens: '' and an 8-byte fingerprint,
-- in either order, each scored as logStateScore says. Any other sorted set
-- is no sliding log's, whether or not it holds a member ''.
local function slidingLog(head)
  local a, b = head[1], head[3]
  return b ~= nil and (a == '' and (#b == 8 or #b > 17) or b == '' and (#a == 8 or #a > 17)) and
    logStateScore(head[2]) and logStateScore(head[4])
end

-- sluiceState decodes v, as decodeState does, if it is shaped like a state
-- that some sluice script keeps in a string; else it returns nothing.
local function sluiceState(v)
  local head = (byte(v, 1) or 0) % VERSIONED
  if head >= 16 and head < FORMATS_END then
    return decodeState(v)
  end
end

-- foreignIsNewer reports whether another algorithm's state, with version v
-- and expiry e, is live and newer than the request's config: the call is
-- then a stale one that changes nothing.
local function foreignIsNewer(v, e)
  return v > version and now < e
end

-- logIsNewer is foreignIsNewer for a sliding log whose state members are
-- head (ZRANGE 0 1 WITHSCORES).
local function logIsNewer(head)
  local j = head[1] == '' and 3 or 1 -- the fingerprint member
  return foreignIsNewer(logVersion(head[j]), -1 - tonumber(head[j + 1]))
end

-- readState reads the bucket's string: it returns the value, the
-- bandwidth count, fingerprint, expiry and fields decoded from it, and
-- whether it is a token bucket's in LEGACY_FORMAT's layout; false
-- when the key is absent or holds another algorithm's state (a sliding
-- log's sorted set included); or nil and the reply to return, for a value
-- sluice did not write or a stale call that changes nothing. A live state
-- built for a later version than the request's has its config adopted.
local function readState()
  -- pcall: a sliding log's key holds a sorted set, and GET on it fails.
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if string.find(v.err, '^WRONGTYPE') and redis.call('TYPE', key).ok == 'zset' then
      local head = redis.call('ZRANGE', key, 0, 1, 'WITHSCORES')
      if not slidingLog(head) then
        return nil, notSluice()
      elseif logIsNewer(head) then
        return nil, staleDenial()
      end
      return false
    end
    return nil, v
  elseif not v then
    return false
  end
  local head = (byte(v, 1) or 0) % VERSIONED
  local legacy = FORMAT == TOKEN_BUCKET_FORMAT and head >= LEGACY_FORMAT and head < LEGACY_FORMAT + 16
  if legacy or head >= FORMAT and head < FORMAT + 16 then
    local n, oldFp, exp, old, v2, b = decodeState(v)
    if n == nil then
      return nil, corrupt()
    end
    if v2 > version and now < exp then
      local adopted = adopt(n, b, v2, oldFp)
      if adopted == nil then
        return nil, corrupt()
      elseif not adopted then
        return nil, staleDenial()
      end
    end
    return v, n, oldFp, exp, old, legacy
  end
  local n, _, exp, _, v2 = sluiceState(v)
  if n == nil then
    return nil, notSluice()
  elseif foreignIsNewer(v2, exp) then
    return nil, staleDenial()
  end
  return false -- another algorithm's: start afresh
end

-- lastAt is PXAT's argument for lastSecond, the second setState last set
-- a key to expire at, as a string: Redis formats a number argument with
-- snprintf, at a cost of thousands of instructions, and Lua's string.format
-- of a whole number costs a fraction of that; calls on many keys in one
-- second share it. A library keeps it from call to call.
local lastSecond, lastAt

-- setState writes v, a state that expires at expiry, at key k, at time t
-- on the caller's clock (given) or the server's, where kept is the expiry
-- of the state read, if this algorithm's state was there; store says how.
--
-- store writes the state packed (as encodeState takes it) to expire at
-- expiry, or deletes the key when the state already equals a new bucket's
-- (expiry at or before now; packed is then not read). kept is the expiry
-- of the state read, if this algorithm's state was there. It returns the
-- reply for a state that does not encode (see corrupt), or nothing.
--
-- On the server's clock the key expires (PXAT) at the end of the whole
-- second in which the state comes to equal a new bucket's. Keys so linger
-- up to a second longer than they must, but a call that leaves the expiry
-- within the second of the stored state's keeps the key's TTL (KEEPTTL),
-- which costs Redis half as much as setting one. A caller's clock need not
-- keep pace with the server's, so with one the key lives a minute longer
-- than its expiry on that clock; the expiry in the state still decides.
local function setState(k, v, expiry, t, given, kept)
  if given then
    local ms = expiry - t
    redis.call('SET', k, v, 'PX', (ms + -ms % 1000) / 1000 + GRACE)
  elseif kept and expiry <= kept + -kept % 1000000 then
    redis.call('SET', k, v, 'KEEPTTL')
  else
    local s = (expiry + -expiry % 1000000) / 1000000
    if s ~= lastSecond then
      lastSecond, lastAt = s, string.format('%d000', s)
    end
    redis.call('SET', k, v, 'PXAT', lastAt)
  end
end

local function store(packed, expiry, kept)
  if expiry <= now then
    redis.call('DEL', key)
    return
  end
  local v = encodeState(packed, expiry)
  if v == nil then
    return corrupt()
  end
  setState(key, v, expiry, now, clockGiven, kept)
end

-- mulDivFloor is floor(a*b/c) for 1 <= b, c <= 2^51 and |a| <= 2^52,
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

-- inherit is the level, in units of newScale, that a bandwidth keeps, by
-- the request's strategy (not ResetTokens), when it goes from level l at
-- scale and capacity oldCap to newCap and newScale, and at least least
-- tokens, as inherit in ratelimit/tokenbucket.go: Proportionally scales the
-- exact level and rounds down once; the others carry whole tokens.
local function inherit(l, scale, oldCap, newCap, newScale, least)
  if strategy == PROPORTIONALLY then
    l, least = mulDivFloor(l, newCap * newScale, oldCap * scale), least * newScale
    if l < least then
      return least
    end
    return l
  end
  local t = (l - l % scale) / scale
  if t > newCap then
    t = newCap
  end
  if strategy == ADDITIVE and newCap > oldCap then
    t = t + newCap - oldCap
  end
  if t < least then
    t = least
  end
  return t * newScale
end

-- match finds the bandwidth of a decoded state of n bandwidths that
-- bandwidth i inherits from: the one with its ID, or with no ID at its
-- position; nil if none.
local function match(i, old, n)
  local id = cfg[8 * i + ID]
  if id == '' then
    if i <= n and old[5 * i + OLD_ID] == '' then
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

-- decide applies Consume, Estimate, Inspect, ConsumeUpTo and Reserve with
-- the algorithm's own functions: bandWait(i, t), the µs until bandwidth i
-- can give t tokens; room(i), the whole tokens bandwidth i can give now;
-- take(t), which takes t from every bandwidth; and, for the algorithms
-- that reserve, lend(t), whether t may be taken on credit. It returns
-- allowed, consumed, the retry after and the binding bandwidth of a denial
-- (0 when allowed), as Apply decides them: the wait is the longest of the
-- bandwidths', and the binding bandwidth the first that waits that long.
local function decide(bandWait, room, take, lend)
  local t = tokens
  if op == INSPECT then
    t = 1
  elseif op == CONSUME_UP_TO then
    for i = 1, count do
      local r = room(i)
      if r < t then
        t = r
      end
    end
    if t > 0 then
      take(t)
      return 1, t, 0, 0
    end
    t = 1 -- none: denied as a Consume of 1 would be
  end
  local wait, slowest = 0, 1
  for i = 1, count do
    local w = bandWait(i, t)
    if w > wait then
      wait, slowest = w, i
    end
  end
  if op == CONSUME and wait == 0 or op == RESERVE and wait <= maxWait and lend(t) then
    take(t)
    return 1, t, wait, 0
  elseif wait > 0 then
    return 0, 0, wait, slowest
  end
  return 1, 0, 0, 0
end

-- refund lowers each bandwidth's count in counts by n, down to 0: Add on
-- the algorithms that count requests.
local function refund(counts, n)
  for i = 1, count do
    local c = counts[i] - n
    if c < 0 then
      c = 0
    end
    counts[i] = c
  end
end

-- bindingOf returns the binding bandwidth and the whole tokens it has left:
-- the one a denial named (binding), or, when allowed, the one with the
-- fewest tokens left, the first of equals.
local function bindingOf(allowed, binding, room)
  if allowed == 0 then
    return binding, room(binding)
  end
  local least = SATURATED
  for i = 1, count do
    local r = room(i)
    if r < least then
      least, binding = r, i
    end
  end
  return binding, least
end

-- refillAfter is the µs until the binding bandwidth, which has left whole
-- tokens, holds one more, by the algorithm's wait(i, t), the µs until
-- bandwidth i holds t: 0 when it is full.
local function refillAfter(binding, left, wait)
  if left >= cfg[8 * binding + CAP] then
    return 0
  end
  return wait(binding, left + 1)
end
