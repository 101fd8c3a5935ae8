-- The redis store's claim script (exactly/dedupe/redis/partition.py): one call per shard and chunk of ids.
--
-- ARGV: 1 key prefix "<namespace>:<partition>:", 2 mode (claim | restore | lookup),
-- 3 expected position (-1: none), 4 position to reach (-1: unchanged, a chunk before the last),
-- 5 count offsets from, 6 newest receive time of the batch (ms), 7-8 lookup slots low..high,
-- 9 slot length (ms), 10 window (ms), 11 ids of this call at or past 5 (counted), 12-13 claimed and
-- duplicates decided by the client (repeats), 14-15 lock key and token (empty: not the lock's
-- shard), 16 groups: per bucket (>I4 slot - low, >I4 bucket, >I4 ids, >d earliest time),
-- 17 ids (16 bytes each, in group order), 18 offsets (>I6 each, in the same order).
-- Returns {position, largest bucket written, index, owner offset, index, owner offset, ...}: only
-- the ids found (duplicates and the caller's own earlier claims), 1-based in call order.
local prefix, mode = ARGV[1], ARGV[2]
local expected, finish = tonumber(ARGV[3]), tonumber(ARGV[4])
local counted_from, newest = tonumber(ARGV[5]), tonumber(ARGV[6])
local low, high = tonumber(ARGV[7]), tonumber(ARGV[8])
local slot_ms, window = tonumber(ARGV[9]), tonumber(ARGV[10])
local groups, ids, offsets = ARGV[16], ARGV[17], ARGV[18]
local meta = prefix .. 'meta'
local writing = mode ~= 'lookup'
local counting = mode == 'claim'
local CHUNK = 4000

if writing then
  if ARGV[14] ~= '' and redis.call('GET', ARGV[14]) ~= ARGV[15] then
    return redis.error_reply('EXACTLY the partition lock was lost to another holder')
  end
  local stored = redis.call('HGET', meta, 'position')
  if (stored and tonumber(stored) or -1) ~= expected then
    return redis.error_reply('EXACTLY position is ' .. (stored or 'gone') .. ', expected ' ..
      string.format('%d', expected) .. ': the shard lost claims or another task wrote')
  end
  local known = redis.call('HGET', meta, 'newest')
  if known and tonumber(known) > newest then newest = tonumber(known) end
end

local function ttl(slot)
  return math.max(1000, (slot + 2) * slot_ms + window - newest)
end

local result = {-1, 0}
local found_fresh, dups = 0, 0
local slot_new, slot_min = {}, {}
local largest = 0
local gpos, ipos, index = 1, 1, 0
for _ = 1, #groups / 20 do
  local rel, bucket, count, earliest
  rel, bucket, count, earliest, gpos = struct.unpack('>I4I4I4d', groups, gpos)
  local gid, pending = {}, {}
  for i = 1, count do
    gid[i] = string.sub(ids, ipos, ipos + 15)
    ipos = ipos + 16
    pending[i] = i
  end
  local owner = {}
  local suffix = ':' .. bucket
  for slot = high, low, -1 do
    if #pending == 0 then break end
    local key = prefix .. slot .. suffix
    local still = pending
    if redis.call('EXISTS', key) == 1 then still = {} end
    for from = 1, (still == pending) and 0 or #pending, CHUNK do
      local last = math.min(from + CHUNK - 1, #pending)
      local args = {}
      for j = from, last do args[#args + 1] = gid[pending[j]] end
      local got = redis.call('HMGET', key, unpack(args))
      for j = from, last do
        local value = got[j - from + 1]
        if value then owner[pending[j]] = value else still[#still + 1] = pending[j] end
      end
    end
    pending = still
  end
  local writes = {}
  for i = 1, count do
    local value = owner[i]
    if value then
      result[#result + 1] = index + i
      result[#result + 1] = value
      local offset = struct.unpack('>I6', offsets, (index + i - 1) * 6 + 1)
      if counting and offset >= counted_from then
        found_fresh = found_fresh + 1
        if tonumber(value) ~= offset then dups = dups + 1 end
      end
    elseif writing then
      writes[#writes + 1] = gid[i]
      writes[#writes + 1] = string.format('%d', struct.unpack('>I6', offsets, (index + i - 1) * 6 + 1))
    end
  end
  if #writes > 0 then
    local slot = low + rel
    local key = prefix .. slot .. suffix
    for from = 1, #writes, CHUNK do
      redis.call('HSET', key, unpack(writes, from, math.min(from + CHUNK - 1, #writes)))
    end
    redis.call('PEXPIRE', key, ttl(slot))
    largest = math.max(largest, redis.call('HLEN', key))
    slot_new[slot] = (slot_new[slot] or 0) + #writes / 2
    if not slot_min[slot] or earliest < slot_min[slot] then slot_min[slot] = earliest end
  end
  index = index + count
end

if writing then
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  local position = math.max(expected, finish)
  if position >= 0 then redis.call('HSET', meta, 'position', string.format('%d', position)) end
  redis.call('HSET', meta, 'newest', string.format('%d', newest))
  if counting then
    local fresh = tonumber(ARGV[11])
    local claimed = fresh + tonumber(ARGV[12])
    local new = fresh - found_fresh
    dups = dups + tonumber(ARGV[13])
    if claimed > 0 then redis.call('HINCRBY', meta, 'claimed', claimed) end
    if new > 0 then redis.call('HINCRBY', meta, 'new', new) end
    if dups > 0 then redis.call('HINCRBY', meta, 'duplicates', dups) end
  end
  for slot, count in pairs(slot_new) do
    local name = string.format('%d', slot)
    redis.call('HINCRBY', meta, 'n:' .. name, count)
    local first = redis.call('HGET', meta, 't:' .. name)
    if not first or tonumber(first) > slot_min[slot] then
      redis.call('HSET', meta, 't:' .. name, string.format('%d', slot_min[slot]))
    end
    redis.call('HSET', meta, 'x:' .. name, string.format('%d', now + ttl(slot)))
  end
  -- slots whose buckets expired: their ids count as aged out
  local fields = redis.call('HGETALL', meta)
  local aged = 0
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, 1, 2) == 'x:' and tonumber(fields[i + 1]) <= now then
      local name = string.sub(field, 3)
      aged = aged + tonumber(redis.call('HGET', meta, 'n:' .. name) or '0')
      redis.call('HDEL', meta, 'n:' .. name, 't:' .. name, field)
    end
  end
  if aged > 0 then redis.call('HINCRBY', meta, 'aged', aged) end
  result[1] = position
end
result[2] = largest
return result
