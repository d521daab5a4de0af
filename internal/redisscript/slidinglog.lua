-- sluice sliding window log: run is one atomic decision on the call's
-- bucket.
--
-- This is ratelimit's SlidingWindowLog (ratelimit/slidinglog.go) in Lua;
-- the two must agree decision for decision and entry for entry, and the
-- tests of internal/redisscript compare them. Read slidinglog.go for the
-- why of each rule; the comments here are about Redis.
--
-- The key holds a sorted set, not prelude.lua's string: one member per
-- token taken, scored with its time in µs (0 to 2^52), and two members
-- with negative scores, which so rank first (0 and 1), for the rest:
--   - the config's fingerprint, its 8 bytes as the member (for a
--     versioned config followed by I7 version, B bandwidth count and the
--     packed bandwidths: see logMember in prelude.lua), scored
--     -1 - expiry (µs);
--   - the empty string, scored -1 - (length + 65536 × serial): the tokens
--     held and the member the next token gets.
-- These two are how every script tells a log (slidingLog in prelude.lua):
-- a sorted set whose first two members are not they is no log, and is
-- refused and left alone, as any value sluice did not write.
-- A token's member is a serial number (ZADD writes it in decimal): unique
-- however many tokens share a microsecond, and small. When the serial
-- would pass SPAN, the tokens are renumbered from 0 in time order, at most
-- once every 3 × bound tokens. A log of up to 126 tokens stays a listpack,
-- about 14 bytes a token by MEMORY USAGE; a longer one is a skiplist, about
-- 100.
--
-- A decision that admits costs three calls (ZRANGE, ZCARD, ZADD), plus a
-- ZCOUNT and a ZREMRANGEBYRANK when the oldest token has left the longest
-- window, a ZCOUNT per bandwidth of a shorter window, the TTL (PEXPIREAT once a
-- second, PEXPIRE on a caller's clock), and a ZRANGE that reads when the
-- binding bandwidth can take one more (RefillAfter; none when it is full
-- or all its window holds is this call's); a denial reads one token per
-- bandwidth that lacks room instead of writing.
--
-- One key per bucket, so the script runs on Redis Cluster: the call's key
-- is the only key it touches. Scores are passed to Redis as numbers, which it
-- writes with 17 digits; Lua's own tostring keeps only 14, so nothing here
-- joins a time into a string.

local META = 2 -- the members before the first token, by rank
local LENGTH = 65536 -- the length's span in the second member's score
local CHUNK = 7000 -- values per ZADD: unpack fails near 8000

-- whole reports whether x, a stored number, is an integer in [0, 2^53).
local function whole(x)
  return x >= 0 and x < SATURATED and x % 1 == 0
end

-- run is the sliding log's decision.
local function run()
  -- Read the two members that hold the state, and the oldest token. found
  -- is whether the key holds a log; foreign whether it holds another
  -- algorithm's state, which Go's Apply also starts afresh.
  local found, foreign = false, false
  local exp, oldFp, oldMember, packed, length, serial, oldest = 0, '', '', 0, 0, 0, nil
  local head = redis.pcall('ZRANGE', key, 0, META, 'WITHSCORES')
  if head.err then
    if not string.find(head.err, '^WRONGTYPE') then
      return head
    end
    local v = redis.pcall('GET', key)
    local n, _, e, _, v2
    if type(v) == 'string' then
      n, _, e, _, v2 = sluiceState(v)
    end
    if n == nil then
      return notSluice()
    elseif foreignIsNewer(v2, e) then
      return staleDenial()
    end
    foreign = true
  elseif #head > 0 then
    -- A sorted set without the state members is not a log, damaged or not:
    -- it is refused and left alone, as any value sluice did not write.
    if not slidingLog(head) then
      return notSluice()
    end
    local j = head[1] == '' and 1 or 3 -- head[j] is '', head[4 - j] the fingerprint
    oldMember, exp, packed = head[4 - j], -1 - tonumber(head[5 - j]), -1 - tonumber(head[j + 1])
    oldFp = string.sub(oldMember, 1, 8)
    local v2, n, b = logVersion(oldMember)
    if v2 > version and now < exp then
      local adopted = adopt(n, b, v2, oldFp)
      if adopted == nil then
        return corrupt()
      elseif not adopted then
        return staleDenial()
      end
    end
    oldest = head[6] and tonumber(head[6])
    if not oldest or not whole(oldest) then
      return corrupt()
    end
    length = packed % LENGTH
    serial = (packed - length) / LENGTH
    -- A log holds the tokens its length says: one that holds more or fewer
    -- was changed by hand.
    if redis.call('ZCARD', key) ~= META + length then
      return corrupt()
    end
    found = true
  end

  -- The longest window and the bound on the tokens held: the smallest
  -- capacity among the bandwidths of that window.
  local longest, bound = 0, 0
  for i = 1, count do
    local w, cap = cfg[8 * i + PERIOD], cfg[8 * i + CAP]
    if w > longest then
      longest, bound = w, cap
    elseif w == longest and cap < bound then
      bound = cap
    end
  end
  local span = 4 * bound
  if span < 4096 then
    span = 4096
  end

  local fresh = not found or op == RESET or now >= exp or
    (op == REPLACE or oldFp ~= fp) and strategy == RESET_TOKENS
  -- counts[i] is how many tokens bandwidth i's window holds. skip is how
  -- many of the oldest tokens go, which the write at the end removes:
  -- until then the log is the tokens from rank META + skip, so that a call
  -- that replies corrupt() has written nothing.
  local counts, skip = {}, 0
  if fresh then
    length, serial = 0, 0
    for i = 1, count do
      counts[i] = 0
    end
  else
    -- Trim: what the longest window no longer holds, then the oldest beyond
    -- the bound.
    local cutoff = now - longest
    if oldest <= cutoff then
      skip = redis.call('ZCOUNT', key, 0, cutoff)
      length = length - skip
    end
    if length > bound then
      skip = skip + length - bound
      length = bound
    end
    for i = 1, count do
      local w = cfg[8 * i + PERIOD]
      if w == longest then
        counts[i] = length
      else
        -- Scores are whole µs: after now - w is from now - w + 1.
        local from = now - w + 1
        if from < 0 then
          from = 0
        end
        -- The newest tokens; those the bound trims may be among them.
        local n = redis.call('ZCOUNT', key, from, '+inf')
        if n > length then
          n = length
        end
        counts[i] = n
      end
    end
  end

  -- consumed is the tokens this call takes, which the key holds only once
  -- written, at its end: until then, the log is the key's tokens with
  -- these at now, after the before tokens that are at or before now (as
  -- take in slidinglog.go logs them).
  local allowed, consumed, removed, retry, binding = 1, 0, 0, 0, 0
  local before = length

  -- bandWait is the µs until bandwidth i can take t; it sets bad if a
  -- token's time is corrupt, and the call then answers corrupt()'s error
  -- whatever decide made of it (take only counts). A bandwidth that lacks room waits for the
  -- token at rank length + t - 1 - capacity among the tokens: see logWait
  -- in slidinglog.go.
  local bad = false
  local function bandWait(i, t)
    local c = 8 * i
    local cap = cfg[c + CAP]
    if counts[i] + t <= cap then
      return 0
    end
    local rank, at = length + t - 1 - cap, now
    if rank >= before + consumed then
      rank = rank - consumed
    elseif rank >= before then
      rank = nil -- one of those this call takes
    end
    if rank then
      rank = META + skip + rank
      at = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2]
      at = at and tonumber(at)
      if not at or not whole(at) then
        bad = true
        return 0
      end
    end
    return at + cfg[c + PERIOD] - now
  end

  -- room is the requests bandwidth i has left. The window of bandwidth i
  -- holds the newest counts[i] tokens, so taking t adds t to every count and
  -- a refund of the newest r takes r from each, down to 0.
  local function room(i)
    local r = cfg[8 * i + CAP] - counts[i]
    if r < 0 then
      return 0
    end
    return r
  end

  -- take counts t more tokens; they are written below, with the expiry.
  local function take(t)
    for i = 1, count do
      counts[i] = counts[i] + t
    end
  end

  if op == ADD then
    if length > 0 then
      -- A refund: the newest tokens go (the write removes them).
      removed = tokens
      if removed > length then
        removed = length
      end
      refund(counts, removed)
    end
  elseif op ~= RESET and op ~= REPLACE then
    allowed, consumed, retry, binding = decide(bandWait, room, take)
    if bad then
      return corrupt()
    end
  end

  -- Settle: the binding bandwidth.
  local left
  binding, left = bindingOf(allowed, binding, room)
  local kept = length - removed -- the tokens from before this call
  length = kept + consumed

  if length == 0 then
    local reply = decision(allowed, consumed, binding, left, retry, 0, 0)
    if not reply then
      return corrupt()
    end
    if found or foreign then
      redis.call('DEL', key)
    end
    return reply
  end

  -- The expiry: when the newest token leaves the longest window. With the
  -- same config and no refund the stored expiry tells the newest kept token;
  -- otherwise it is read.
  local newest, last = now, now
  if kept > 0 then
    if removed > 0 or oldFp ~= fp then
      last = redis.call('ZRANGE', key, -1 - removed, -1 - removed, 'WITHSCORES')[2]
      last = last and tonumber(last)
      if not last or not whole(last) then
        return corrupt()
      end
    else
      last = exp - longest
    end
    if consumed == 0 or last > now then
      newest = last
    end
  end
  local expiry = newest + longest

  -- When the binding bandwidth can take one more (bandWait): the kept
  -- tokens after now, which a clock that stepped back leaves, rank after
  -- those taken.
  before = kept
  if consumed > 0 and last > now then
    -- Those the trim skips are the oldest.
    before = redis.call('ZCOUNT', key, 0, now) - skip
    if before < 0 then
      before = 0
    end
  end
  local refill = refillAfter(binding, left, bandWait)
  if bad then
    return corrupt()
  end
  local reply = decision(allowed, consumed, binding, left, retry, expiry - now, refill)
  if not reply then
    return corrupt()
  end

  -- Write: a fresh log replaces whatever the key held; else the trimmed
  -- and refunded tokens go; a config change drops the old fingerprint's
  -- member; a serial that would pass the span renumbers the tokens (while
  -- both state members still rank first).
  local args, n = {}, 0
  if fresh and (found or foreign) then
    redis.call('DEL', key)
  end
  if skip > 0 then
    redis.call('ZREMRANGEBYRANK', key, META, META + skip - 1)
  end
  if removed > 0 then
    redis.call('ZREMRANGEBYRANK', key, -removed, -1)
  end
  if consumed > 0 and serial + consumed > span then
    local all = redis.call('ZRANGE', key, META, -1, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', key, META, -1)
    for j = 2, #all, 2 do
      args[n + 1], args[n + 2] = all[j], j / 2 - 1
      n = n + 2
    end
    serial = n / 2
  end
  local member = logMember()
  if not fresh and oldMember ~= member then
    redis.call('ZREM', key, oldMember)
  end
  for j = 0, consumed - 1 do
    args[n + 1], args[n + 2] = now, serial + j
    n = n + 2
  end
  serial = serial + consumed
  if fresh or oldMember ~= member or expiry ~= exp then
    args[n + 1], args[n + 2] = -1 - expiry, member
    n = n + 2
  end
  local repacked = length + LENGTH * serial
  if fresh or repacked ~= packed then
    args[n + 1], args[n + 2] = -1 - repacked, ''
    n = n + 2
  end
  local from = 1
  while from <= n do
    local to = from + CHUNK - 1
    if to > n then
      to = n
    end
    redis.call('ZADD', key, unpack(args, from, to))
    from = to + 1
  end

  -- The TTL, as store() in prelude.lua sets it; a key whose expiry stays
  -- within the second it was set for keeps its TTL.
  if clockGiven then
    local ms = expiry - now
    redis.call('PEXPIRE', key, (ms + -ms % 1000) / 1000 + GRACE)
  elseif fresh or expiry > exp + -exp % 1000000 then
    redis.call('PEXPIREAT', key, (expiry + -expiry % 1000000) / 1000)
  end
  return reply
end
