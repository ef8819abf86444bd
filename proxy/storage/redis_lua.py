"""The Lua scripts of the Redis store. Each runs atomically on the server, so a record's state,
its membership in the state sets, the counters and its event in the stream never disagree, and
two replicas racing on one record (promotion against rejection, two sweepers) change it once.

Keys are built inside the scripts from the prefix passed in ARGV: fine on one Redis server (or a
primary with replicas), not on Redis Cluster, which needs every key declared in KEYS.
A record's hash: ``{p}r:{label}``; ``{p}id`` maps cache ids to labels; zsets ``{p}all`` (every
label), ``{p}live`` (pending and ready), ``{p}dead`` (by created_at), ``{p}pending`` (by ready_at)
and ``{p}exp`` (live, by expires_at); sets ``{p}t:{tenant}``, ``{p}s:{tenant}\\x1f{session}`` and
``{p}i:{intent}``; ``{p}counts`` (state, scope, intent -> n), ``{p}bytes`` (live answer bytes) and
the stream ``{p}events``. The judge's refusals: a hash ``{p}no:{tenant}`` (request hash -> the
refused cache ids, space-separated, oldest first), read with one HGET, and for each refused record
a set ``{p}nor:{label}`` of the ``tenant\\x1frequest_hash`` naming it, by which its retirement or
delete takes its refusals.
The learned levels' labels: a list ``{p}lb:{tenant}\\x1f{intent}`` (compact JSON, as pushed, trimmed
to the newest ``LABELS_KEPT``) and a set ``{p}lbi:{tenant}`` of the intents it has lists for, by which
a purge finds them; neither expires, since labels outlive their records.
"""

from __future__ import annotations

_COMMON = """
local p = ARGV[1]
local maxlen = ARGV[2]
local function is_live(s) return s == 'pending' or s == 'ready' end
local function event(op, label, state)
  redis.call('XADD', p .. 'events', 'MAXLEN', '~', maxlen, '*', 'op', op, 'label', label, 'state', state)
end
local function count(state, scope, intent, n)
  redis.call('HINCRBY', p .. 'counts', state .. '\\31' .. scope .. '\\31' .. intent, n)
end
local function unrefuse(label, cache_id)
  local back = p .. 'nor:' .. label
  for _, named in ipairs(redis.call('SMEMBERS', back)) do
    local cut = string.find(named, '\\31', 1, true)
    local key, hash = p .. 'no:' .. string.sub(named, 1, cut - 1), string.sub(named, cut + 1)
    local have = redis.call('HGET', key, hash)
    if have then
      local kept = {}
      for id in string.gmatch(have, '[^ ]+') do
        if id ~= cache_id then kept[#kept + 1] = id end
      end
      if #kept == 0 then redis.call('HDEL', key, hash) else redis.call('HSET', key, hash, table.concat(kept, ' ')) end
    end
  end
  redis.call('DEL', back)
end
local function states_of(csv)
  local set = {}
  for s in string.gmatch(csv, '[^,]+') do set[s] = true end
  return set, csv == ''
end
"""

# ARGV: prefix, maxlen, backstop expiry (unix ms), cache_id, tenant, session, intent, state, scope,
# answer_bytes, created_at, ready_at, expires_at, then the hash's field/value pairs.
# Returns the new label, or an error for a cache id already stored.
INSERT = (
    _COMMON
    + """
local cache_id, tenant, session, intent = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local state, scope, nbytes = ARGV[8], ARGV[9], ARGV[10]
if redis.call('HEXISTS', p .. 'id', cache_id) == 1 then
  return redis.error_reply('duplicate cache_id ' .. cache_id)
end
local label = redis.call('INCR', p .. 'label')
local k = p .. 'r:' .. label
local fields = {'label', label}
for i = 14, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', k, unpack(fields))
redis.call('PEXPIREAT', k, ARGV[3])
redis.call('HSET', p .. 'id', cache_id, label)
redis.call('ZADD', p .. 'all', label, label)
redis.call('SADD', p .. 't:' .. tenant, label)
redis.call('SADD', p .. 's:' .. tenant .. '\\31' .. session, label)
redis.call('SADD', p .. 'i:' .. intent, label)
if is_live(state) then
  redis.call('ZADD', p .. 'live', label, label)
  redis.call('ZADD', p .. 'exp', ARGV[13], label)
  redis.call('INCRBY', p .. 'bytes', nbytes)
  if state == 'pending' then redis.call('ZADD', p .. 'pending', ARGV[12], label) end
else
  redis.call('ZADD', p .. 'dead', ARGV[11], label)
end
count(state, scope, intent, 1)
event('insert', label, state)
return label
"""
)

_FIELDS = "'state', 'scope', 'intent', 'answer_bytes', 'expires_at', 'ready_at', 'created_at', 'cache_id'"

# ARGV: prefix, maxlen, new state, states it may start from (comma list; empty: any), labels...
# Returns label, cache_id pairs of the records it changed.
SET_STATE = (
    _COMMON
    + """
local new = ARGV[3]
local from, any = states_of(ARGV[4])
local out = {}
for i = 5, #ARGV do
  local label = ARGV[i]
  local k = p .. 'r:' .. label
  local f = redis.call('HMGET', k, """
    + _FIELDS
    + """)
  local old = f[1]
  if old and (any or from[old]) then
    if old ~= new then
      redis.call('HSET', k, 'state', new)
      count(old, f[2], f[3], -1)
      count(new, f[2], f[3], 1)
      if old == 'pending' then redis.call('ZREM', p .. 'pending', label) end
      if new == 'pending' then redis.call('ZADD', p .. 'pending', f[6], label) end
      if is_live(old) and not is_live(new) then
        redis.call('ZREM', p .. 'live', label)
        redis.call('ZREM', p .. 'exp', label)
        redis.call('ZADD', p .. 'dead', f[7], label)
        redis.call('DECRBY', p .. 'bytes', f[4])
        unrefuse(label, f[8])
      elseif is_live(new) and not is_live(old) then
        redis.call('ZREM', p .. 'dead', label)
        redis.call('ZADD', p .. 'live', label, label)
        redis.call('ZADD', p .. 'exp', f[5], label)
        redis.call('INCRBY', p .. 'bytes', f[4])
      end
      event('state', label, new)
    end
    out[#out + 1] = label
    out[#out + 1] = f[8]
  end
end
return out
"""
)

# ARGV: prefix, maxlen, states it may remove (comma list; empty: any), labels...
# Returns label, cache_id pairs of the records it removed.
DELETE = (
    _COMMON
    + """
local from, any = states_of(ARGV[3])
local out = {}
for i = 4, #ARGV do
  local label = ARGV[i]
  local k = p .. 'r:' .. label
  local f = redis.call('HMGET', k, 'state', 'scope', 'intent', 'answer_bytes', 'cache_id', 'tenant', 'session')
  if f[1] and (any or from[f[1]]) then
    redis.call('DEL', k)
    redis.call('HDEL', p .. 'id', f[5])
    for _, z in ipairs({'all', 'live', 'dead', 'pending', 'exp'}) do redis.call('ZREM', p .. z, label) end
    redis.call('SREM', p .. 't:' .. f[6], label)
    redis.call('SREM', p .. 's:' .. f[6] .. '\\31' .. f[7], label)
    redis.call('SREM', p .. 'i:' .. f[3], label)
    count(f[1], f[2], f[3], -1)
    if is_live(f[1]) then redis.call('DECRBY', p .. 'bytes', f[4]) end
    unrefuse(label, f[5])
    event('delete', label, f[1])
    out[#out + 1] = label
    out[#out + 1] = f[5]
  end
end
return out
"""
)

# ARGV: prefix, maxlen, source set or '' , labels whose hash is gone (expired by Redis).
# Their index entries go, and a delete event tells every replica.
DANGLING = (
    _COMMON
    + """
for i = 4, #ARGV do
  local label = ARGV[i]
  if redis.call('EXISTS', p .. 'r:' .. label) == 0 then
    for _, z in ipairs({'all', 'live', 'dead', 'pending', 'exp'}) do redis.call('ZREM', p .. z, label) end
    if ARGV[3] ~= '' then redis.call('SREM', ARGV[3], label) end
    event('delete', label, '')
  end
end
return 0
"""
)

# ARGV: prefix, cache_id, now. A record deleted meanwhile is left alone (never recreated).
HIT = """
local label = redis.call('HGET', ARGV[1] .. 'id', ARGV[2])
if not label then return 0 end
local k = ARGV[1] .. 'r:' .. label
if redis.call('EXISTS', k) == 0 then return 0 end
redis.call('HINCRBY', k, 'hit_count', 1)
redis.call('HSET', k, 'last_hit_at', ARGV[3])
return 1
"""

# ARGV: prefix, cache_id, delta. Returns the new score within [0, 1], or nil for no record.
FEEDBACK = """
local label = redis.call('HGET', ARGV[1] .. 'id', ARGV[2])
if not label then return nil end
local k = ARGV[1] .. 'r:' .. label
local score = redis.call('HGET', k, 'feedback_score')
if not score then return nil end
local v = math.max(0.0, math.min(1.0, tonumber(score) + tonumber(ARGV[3])))
local text = string.format('%.17g', v)
redis.call('HSET', k, 'feedback_score', text)
return text
"""

# ARGV: prefix, before. Drops session-last entries idle since ``before``; returns how many.
PURGE_SESSION_LAST = """
local keys = redis.call('ZRANGEBYSCORE', ARGV[1] .. 'last_at', '-inf', ARGV[2])
for _, k in ipairs(keys) do
  redis.call('DEL', k)
  redis.call('ZREM', ARGV[1] .. 'last_at', k)
end
return #keys
"""

# ARGV: prefix, tenant, request hash, how many a wording keeps, cache ids... Remembers the live
# ones among them as refused for that wording, newest last, and names the wording in each one's
# ``nor:{label}``. Both expire with the record hashes they name (the tenant's hash with its
# longest-lived one): the sweeper's delete takes a refusal first, Redis's expiry is the backstop.
# Returns how many the wording keeps, 0 where none of them was live.
REFUSE = """
local p, tenant, hash, cap = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local key = p .. 'no:' .. tenant
local ids = {}
local have = redis.call('HGET', key, hash)
if have then
  for id in string.gmatch(have, '[^ ]+') do ids[#ids + 1] = id end
end
local latest = 0
for i = 5, #ARGV do
  local cache_id = ARGV[i]
  local label = redis.call('HGET', p .. 'id', cache_id)
  local k = label and (p .. 'r:' .. label)
  local state = k and redis.call('HGET', k, 'state')
  if state == 'pending' or state == 'ready' then
    for j = #ids, 1, -1 do
      if ids[j] == cache_id then table.remove(ids, j) end
    end
    ids[#ids + 1] = cache_id
    local back, until_ms = p .. 'nor:' .. label, redis.call('PEXPIRETIME', k)
    redis.call('SADD', back, tenant .. '\\31' .. hash)
    if until_ms > 0 then redis.call('PEXPIREAT', back, until_ms) end
    latest = math.max(latest, until_ms)
  end
end
if latest == 0 then return 0 end
while #ids > cap do table.remove(ids, 1) end
redis.call('HSET', key, hash, table.concat(ids, ' '))
if redis.call('PEXPIRETIME', key) < latest then redis.call('PEXPIREAT', key, latest) end
return #ids
"""

# ARGV: prefix, tenant. Forgets the tenant's labels (a purge): each intent's list and the set naming
# them, at once, so labels added meanwhile are either all gone or all kept and named. Returns how
# many lists it deleted.
FORGET_LABELS = """
local p, tenant = ARGV[1], ARGV[2]
local named = p .. 'lbi:' .. tenant
local intents = redis.call('SMEMBERS', named)
for _, intent in ipairs(intents) do redis.call('DEL', p .. 'lb:' .. tenant .. '\\31' .. intent) end
redis.call('DEL', named)
return #intents
"""
