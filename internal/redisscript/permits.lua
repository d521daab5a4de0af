-- sluice concurrency permits: permits is one atomic call on one key's
-- permits, an acquire, a release, a renew or an inspect.
--
-- This is ratelimit's ApplyPermit (ratelimit/permitstate.go) in Lua; the
-- two must agree decision for decision and lease for lease, and the tests
-- of internal/redisscript compare them. Read ApplyPermit for the rules;
-- the comments here are about Redis.
--
-- It stands alone: it reads none of prelude.lua's locals, so that its
-- script (EVALSHA) is this file alone. In the library it is a block of its
-- own after the algorithms'.
--
-- The key (PermitKey in keys.go: the bucket's key, then ':permits') holds a
-- sorted set with a member per permit held, weights counted out: a holder
-- that holds a weight of w has the members holder#1 to holder#w, each
-- scored with the end of its lease, in µs. The number after the last '#'
-- is digits alone, so no two holders share a member, whatever bytes their
-- names hold. A holder's members are written together, always with one
-- score, so they are reclaimed together, and they are numbered from 1 with
-- no gap: a holder holds a permit exactly when holder#1 is there, and its
-- members are found by trying holder#1, #2, ... until one is missing. The
-- permits held are then the set's cardinality, and the set never holds
-- more members than the largest limit it was acquired under
-- (ratelimit.MaxPermits at most).
--
-- Every call first removes the members whose lease has ended (score at or
-- before now), then acts. A call that writes sets the key to expire when
-- its last lease ends: at that millisecond (PEXPIREAT, rounded up) on the
-- server's clock, or, on a caller's clock, which need not keep pace with
-- the server's, a minute after it (PEXPIRE); a set emptied by the call is
-- gone with its last member. A key's state so never outlives its permits.
--
-- The call's argument is the request, packed by NewPermitCall in
-- permits.go (little-endian): B op, d limit, d lease (µs), d weight (for
-- Release and Renew a hint: the weight the permit was acquired with,
-- clamped to 1 to MaxPermits), d now (µs; -1: the server's TIME), then the
-- holder's bytes to the end.
--
-- The reply is one string, as PERMIT_REPLY packs it (PermitCall.Decision
-- decodes it): granted (1 or 0), then the permits held after the call and
-- the retry after (µs) of a denied acquire, as doubles.
--
-- Scores and times are whole µs below 2^53, where doubles are exact;
-- Redis writes a number argument with 17 digits, so they reach it whole.

local P_ACQUIRE, P_RELEASE, P_RENEW, P_INSPECT = 0, 1, 2, 3
local PERMIT_REQUEST = '<Bdddd'
local PERMIT_HOLDER = 34 -- the holder's first byte: after B and four d
local PERMIT_REPLY = '<Bdd'
local MAX_PERMITS = 65536 -- ratelimit.MaxPermits
local PERMIT_CHUNK = 3000 -- members per ZADD (two values each) or ZREM: unpack fails near 8000
local PERMIT_GRACE = 60000 -- ms a key outlives its last lease on a caller's clock

-- units runs a command on holder's members, a chunk at a time from
-- holder#1: given a score, a ZADD at it, of the members 1 to n when n is
-- given (new ones), else of those there are (XX CH: it moves them and
-- counts them); without, a ZREM of those there are. A chunk that finds
-- fewer members than it names is the last. The first chunk names hint + 1
-- members, so that a hint of the holder's weight finds them all in one
-- command. It returns the members found (or written).
local function units(key, holder, hint, n, score)
  local cmd, args, lead = 'ZREM', {}, 0
  if score and n then
    cmd = 'ZADD'
  elseif score then
    cmd, args, lead = 'ZADD', {'XX', 'CH'}, 2
  end
  local found, from, size = 0, 1, hint + 1
  if size > PERMIT_CHUNK then
    size = PERMIT_CHUNK
  end
  while true do
    local to = from + size - 1
    if n and to > n then
      to = n
    end
    local k = lead
    for i = from, to do
      if score then
        k = k + 1
        args[k] = score
      end
      k = k + 1
      args[k] = holder .. '#' .. i
    end
    local got = redis.call(cmd, key, unpack(args, 1, k))
    found = found + got
    if got < to - from + 1 or to == n then
      return found
    end
    from, size = to + 1, PERMIT_CHUNK
  end
end

-- expire sets key to expire when its last lease ends (see the top of this
-- file); a set that the call emptied is gone already.
local function expire(key, now, given)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 then
    return
  end
  local at = tonumber(last[2])
  if given then
    local ms = at - now
    redis.call('PEXPIRE', key, (ms + -ms % 1000) / 1000 + PERMIT_GRACE)
  else
    redis.call('PEXPIREAT', key, (at + -at % 1000) / 1000)
  end
end

-- permits decides the request args[1] on the permits at keys[1].
local function permits(keys, args)
  local key, arg = keys[1], args[1]
  local op, limit, lease, weight, now = struct.unpack(PERMIT_REQUEST, arg)
  local holder = string.sub(arg, PERMIT_HOLDER)
  local given = now >= 0
  if not given then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2] -- Lua converts the strings
  end

  -- Reclaim, counting first: a set larger than any limit is no permits'.
  local held = redis.call('ZCARD', key)
  if held > MAX_PERMITS then
    return redis.error_reply('sluice: corrupt state at key ' .. key .. ': more members than any permit limit')
  end
  if held > 0 then
    held = held - redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  end

  local granted, retry, wrote = 0, 0, false
  if op == P_INSPECT then
    if held < limit then
      granted = 1
    end
    return struct.pack(PERMIT_REPLY, granted, held, retry)
  end
  local ends = now + lease
  local lease1 = held > 0 and redis.call('ZSCORE', key, holder .. '#1')
  if lease1 then
    -- The holder holds a permit: Release frees it; Acquire (sent again)
    -- and Renew lease it afresh, unless it ends then already.
    if op == P_RELEASE then
      held = held - units(key, holder, weight)
      wrote = true
    elseif tonumber(lease1) ~= ends then
      units(key, holder, weight, nil, ends)
      wrote = true
    end
    granted = 1
  elseif op == P_ACQUIRE then
    if held + weight <= limit then
      units(key, holder, weight, weight, ends)
      held, granted, wrote = held + weight, 1, true
    else
      retry = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]) - now
    end
  end
  if wrote then
    expire(key, now, given)
  end
  return struct.pack(PERMIT_REPLY, granted, held, retry)
end
