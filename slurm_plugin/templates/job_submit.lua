--[[
job_submit.lua for Slurm's job_submit/lua plugin (JobSubmitPlugins=lua), as
rendered by `hetrun policy plan|apply` (hetrun.slurm_plugin.policy.lua).
slurmctld runs it for every submission, sbatch/srun/salloc alike, so the pool
policy holds for plain Slurm users as well as for hetrun:

  * a job of one of the policy's accounts that names no QOS gets the
    default tier's QOS (other accounts keep Slurm's default);
  * a job that names a tier, or one of hetrun's QoS classes (low, normal,
    high, critical), gets that tier's QOS;
  * a job that by itself asks for more than its account's quota (GrpTRES)
    is refused with a message naming the quota (a job that fits the quota
    but not what is left of it pends: Slurm's own GrpTRES enforcement);
  * with time slicing, a short job that names no partition and asks for no
    GRES (GPU, shard) goes to the time-sliced partition.

Rendered from the policy file; edit the policy, not this file.
--]]

local POLICY = --@POLICY@--

-- Slurm marks an unset number with NO_VAL and "no limit" with INFINITE, each at
-- the field's own width: 16-bit fields (cpus_per_task, ntasks_per_node,
-- pn_min_cpus) use NO_VAL16 = 0xfffe / INFINITE16 = 0xffff, 32-bit ones
-- (num_tasks, min_nodes, min_cpus, time_limit, het_job_offset) NO_VAL =
-- 0xfffffffe / INFINITE = 0xffffffff, 64-bit ones NO_VAL64 / INFINITE64
-- (beyond 2^63 as a Lua double). Reading a 16-bit NO_VAL16 as a count once
-- refused `sbatch -n 1` as "cpu=65534".
local NO_VAL16, NO_VAL, TWO63 = 65534, 4294967294, 9223372036854775808

local function unset16(n) return n == nil or n >= NO_VAL16 end
local function unset32(n) return n == nil or n >= NO_VAL end
local function unset64(n) return n == nil or n >= TWO63 end
local function unset(n) return unset32(n) end  -- the 32-bit fields (time_limit)

local function count16(n, default)
   if unset16(n) then return default end
   return n
end

local function count32(n, default)
   if unset32(n) then return default end
   return n
end

-- slurm.conf's global DefMemPerCPU / DefMemPerNode: Slurm 22.05's lua API shows
-- only the partitions' own defaults, so the file is read (slurmctld's
-- SLURM_CONF, else the slurm.conf next to this script, where slurmctld looks
-- for both). Read on every submission: a reconfigure can change it, and the
-- file is small.
local function script_dir()
   local src = debug.getinfo(1, "S").source
   if string.sub(src, 1, 1) ~= "@" then return nil end
   return string.match(string.sub(src, 2), "^(.*)/[^/]*$")
end

local function conf_defaults()
   local path = os.getenv("SLURM_CONF")
   if path == nil or path == "" then
      local dir = script_dir()
      if dir == nil then return {parts = {}} end
      path = dir .. "/slurm.conf"
   end
   local file = io.open(path, "r")
   if file == nil then return {parts = {}} end
   local out = {parts = {}}
   for line in file:lines() do
      line = string.gsub(line, "#.*$", "")
      local lower = string.lower(line)
      if string.find(lower, "^%s*partitionname") then
         local name = string.match(line, "^%s*%a+%s*=%s*([^%s]+)")
         if string.find(lower, "default%s*=%s*yes") then
            out.default_partition = name
         end
         -- The per-GPU defaults are not in 22.05's part_list: read from the partition's line.
         local part = {}
         for key, value in string.gmatch(line, "(%a+)%s*=%s*(%S+)") do
            local k = string.lower(key)
            if k == "defcpupergpu" or k == "defmempergpu" then part[k] = tonumber(value) end
         end
         out.parts[name] = part
      elseif not string.find(lower, "^%s*nodename") then
         -- Only global lines: a partition's own DefMemPerCPU is in part_list.
         for key, value in string.gmatch(line, "(%a+)%s*=%s*(%S+)") do
            local k = string.lower(key)
            if k == "defmempercpu" or k == "defmempernode" or k == "defcpupergpu" or k == "defmempergpu" then
               out[k] = tonumber(value)  -- nil for UNLIMITED
            end
         end
      end
   end
   file:close()
   return out
end

-- "gres:gpu:a100:2,gres:shard:4" (22.05) or "gres/gpu:2" (later) -> {["gres/gpu"]=2, ...}
local function parse_gres(spec, factor, into)
   if spec == nil or spec == "" then return end
   for item in string.gmatch(spec, "[^,]+") do
      local body = string.gsub(string.gsub(item, "^gres[:/]", ""), "^gpu$", "gpu:1")
      local parts = {}
      for p in string.gmatch(body, "[^:]+") do table.insert(parts, p) end
      local name, n = parts[1], tonumber(parts[#parts])
      if n == nil then n = 1 end
      if name ~= nil then
         local key = "gres/" .. name
         into[key] = (into[key] or 0) + n * factor
         if #parts == 3 then
            local typed = key .. ":" .. string.lower(parts[2])
            into[typed] = (into[typed] or 0) + n * factor
         end
      end
   end
end

-- The partitions whose defaults apply: the job's (a comma list), else the
-- default one. part_list holds the partitions the user may use, keyed by name.
local function job_partitions(job_desc, part_list, conf)
   local names = {}
   local spec = job_desc.partition
   if spec == nil or spec == "" then spec = conf.default_partition end
   if spec ~= nil and part_list ~= nil then
      for name in string.gmatch(spec, "[^,]+") do
         if part_list[name] ~= nil then table.insert(names, part_list[name]) end
      end
   end
   return names
end

-- Memory (MB) Slurm will give the job: --mem per node, --mem-per-cpu per CPU,
-- else the partition's DefMemPerCPU/DefMemPerNode (a partition shows
-- def_mem_per_node = 0 when it sets neither), else slurm.conf's. With several
-- partitions the smallest default counts (never more than Slurm may give);
-- --mem=0 (the whole node) and no default at all are left to Slurm: nil.
local function job_mem(job_desc, part_list, nodes, cpus, conf)
   local per_node = job_desc.min_mem_per_node
   if per_node ~= nil and not unset64(per_node) then
      if per_node == 0 then return nil end
      return per_node * nodes
   end
   local per_cpu = job_desc.min_mem_per_cpu
   if per_cpu ~= nil and not unset64(per_cpu) then return per_cpu * cpus end
   local best = nil
   for _, part in ipairs(job_partitions(job_desc, part_list, conf)) do
      local mem = nil
      if part.def_mem_per_cpu ~= nil and not unset64(part.def_mem_per_cpu) and part.def_mem_per_cpu > 0 then
         mem = part.def_mem_per_cpu * cpus
      elseif part.def_mem_per_node ~= nil and not unset64(part.def_mem_per_node) and part.def_mem_per_node > 0 then
         mem = part.def_mem_per_node * nodes
      elseif conf.defmempercpu ~= nil and conf.defmempercpu > 0 then
         mem = conf.defmempercpu * cpus
      elseif conf.defmempernode ~= nil and conf.defmempernode > 0 then
         mem = conf.defmempernode * nodes
      end
      if mem == nil then return nil end  -- one partition without a default: unknown
      if best == nil or mem < best then best = mem end
   end
   if best ~= nil then return best end
   if conf.defmempercpu ~= nil and conf.defmempercpu > 0 then return conf.defmempercpu * cpus end
   if conf.defmempernode ~= nil and conf.defmempernode > 0 then return conf.defmempernode * nodes end
   return nil
end

-- A per-GPU default (DefCpuPerGPU, DefMemPerGPU: key lower-cased) of the job's
-- partitions, the partition's own line before slurm.conf's global one; the
-- smallest over the partitions, nil where one has none.
local function per_gpu_default(job_desc, part_list, conf, key)
   local best = nil
   local parts = job_partitions(job_desc, part_list, conf)
   if #parts == 0 then return conf[key] end
   for _, part in ipairs(parts) do
      local own = (conf.parts[part.name] or {})[key]
      local v = own or conf[key]
      if v == nil then return nil end
      if best == nil or v < best then best = v end
   end
   return best
end

-- What the job asks for in total, for the TRES a quota can name. Every count
-- is a lower bound of what Slurm allocates: unset means Slurm's default
-- (1 node, 1 task per node, 1 CPU per task, DefCpuPerGPU CPUs per GPU), never more.
local function job_tres(job_desc, part_list, conf)
   local nodes = count32(job_desc.min_nodes, 1)
   local cpt = count16(job_desc.cpus_per_task, 1)
   local tasks = count32(job_desc.num_tasks, nil)
   if tasks == nil then
      local per_node = count16(job_desc.ntasks_per_node, 1)
      tasks = nodes * per_node
   end
   local cpus = math.max(count32(job_desc.min_cpus, 1), tasks * cpt,
                         nodes * count16(job_desc.pn_min_cpus, 1))
   local tres = {node = nodes}
   parse_gres(job_desc.tres_per_node, nodes, tres)
   parse_gres(job_desc.tres_per_job, 1, tres)
   parse_gres(job_desc.tres_per_task, tasks, tres)
   -- Slurm 22.05 also shows tres_per_node as the older `gres` field: one of them.
   if job_desc.tres_per_node == nil or job_desc.tres_per_node == "" then
      parse_gres(job_desc.gres, nodes, tres)
   end
   local gpus = tres["gres/gpu"] or 0
   if gpus > 0 and unset16(job_desc.cpus_per_task) then
      local per_gpu = per_gpu_default(job_desc, part_list, conf, "defcpupergpu")
      if per_gpu ~= nil then cpus = math.max(cpus, gpus * per_gpu) end
   end
   tres.cpu = cpus
   local mem = nil
   local explicit = (job_desc.min_mem_per_node ~= nil and not unset64(job_desc.min_mem_per_node)) or
                    (job_desc.min_mem_per_cpu ~= nil and not unset64(job_desc.min_mem_per_cpu))
   if gpus > 0 and not explicit then
      local per_gpu = per_gpu_default(job_desc, part_list, conf, "defmempergpu")
      if per_gpu ~= nil then mem = gpus * per_gpu end
   end
   if mem == nil then mem = job_mem(job_desc, part_list, nodes, cpus, conf) end
   if mem ~= nil then tres.mem = mem end
   return tres
end

-- A heterogeneous job reaches this script once per component (het_job_offset
-- 0, 1, ...), one after another in one request, and Slurm's GrpTRES counts the
-- components together (they start together): the components are summed per
-- submitting user and account, restarting at offset 0.
local het_sum = {}

local function with_het_components(job_desc, account, submit_uid, tres)
   local offset = job_desc.het_job_offset
   if unset32(offset) then return tres end
   local key = tostring(submit_uid) .. "/" .. tostring(account)
   if offset == 0 or het_sum[key] == nil then het_sum[key] = {} end
   local total = het_sum[key]
   for k, n in pairs(tres) do total[k] = (total[k] or 0) + n end
   local out = {}
   for k, n in pairs(total) do out[k] = n end
   return out
end

local function over_quota(account, tres, het)
   local quota = POLICY.quotas[account]
   if quota == nil then return nil end
   for key, limit in pairs(quota) do
      local want = tres[key] or 0
      if want > limit then
         local unit = ""
         if key == "mem" then unit = "M" end
         local who = "job asks"
         if het then who = "heterogeneous job's components together ask" end
         return string.format(
            "hetrun policy: %s for %s=%d%s but account %s's quota is GrpTRES %s=%d%s; " ..
            "ask for at most %d%s, or submit under another account",
            who, key, want, unit, account, key, limit, unit, limit, unit)
      end
   end
   return nil
end

-- Any GPU, shard or other GRES: such a job stays where Slurm routes it, since
-- the time-sliced partition may have no node with that GRES (it would be refused).
local function asks_gres(tres)
   for key, n in pairs(tres) do
      if string.sub(key, 1, 5) == "gres/" and n > 0 then return true end
   end
   return false
end

-- A tier name or a hetrun QoS class -> the tier's QOS; anything else unchanged.
local function map_qos(qos)
   if qos == nil or qos == "" then return nil end
   return POLICY.tiers[qos] or POLICY.classes[qos] or qos
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local account = job_desc.account
   if account == nil or account == "" then
      account = job_desc.default_account
   end
   local qos = map_qos(job_desc.qos)
   -- Only the policy's accounts may use the tier QOS; other accounts keep
   -- Slurm's own default (a tier QOS there would be refused as invalid).
   if qos == nil and account ~= nil and POLICY.accounts[account] then
      qos = POLICY.default_qos
   end
   if qos ~= nil and qos ~= job_desc.qos then
      job_desc.qos = qos
   end
   local tres = with_het_components(job_desc, account, submit_uid,
                                    job_tres(job_desc, part_list, conf_defaults()))
   if account ~= nil then
      local msg = over_quota(account, tres, not unset32(job_desc.het_job_offset))
      if msg ~= nil then
         slurm.log_user("%s", msg)
         slurm.log_info("%s (uid %s)", msg, tostring(submit_uid))
         return slurm.ERROR
      end
   end
   local slicing = POLICY.slicing
   if slicing ~= nil and (job_desc.partition == nil or job_desc.partition == "")
      and not unset(job_desc.time_limit) and job_desc.time_limit <= slicing.max_minutes
      and not asks_gres(tres) then
      job_desc.partition = slicing.partition
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_ptr, part_list, modify_uid)
   local qos = map_qos(job_desc.qos)
   if qos ~= nil and qos ~= job_desc.qos then
      job_desc.qos = qos
   end
   return slurm.SUCCESS
end

return slurm.SUCCESS
