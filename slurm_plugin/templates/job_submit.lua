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

-- Slurm marks unset numbers with NO_VAL (0xfffffffe) and friends.
local function unset(n)
   return n == nil or n >= 4294967294
end

local function count_of(n, default)
   if unset(n) then return default end
   return n
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

-- What the job asks for in total, for the TRES a quota can name.
local function job_tres(job_desc)
   local nodes = count_of(job_desc.min_nodes, 1)
   local tasks = count_of(job_desc.num_tasks, nodes)
   local cpt = count_of(job_desc.cpus_per_task, 1)
   local cpus = math.max(count_of(job_desc.min_cpus, 1), tasks * cpt)
   local tres = {cpu = cpus, node = nodes}
   parse_gres(job_desc.tres_per_node, nodes, tres)
   parse_gres(job_desc.tres_per_job, 1, tres)
   parse_gres(job_desc.tres_per_task, tasks, tres)
   -- Slurm 22.05 also shows tres_per_node as the older `gres` field: one of them.
   if job_desc.tres_per_node == nil or job_desc.tres_per_node == "" then
      parse_gres(job_desc.gres, nodes, tres)
   end
   return tres
end

local function over_quota(account, tres)
   local quota = POLICY.quotas[account]
   if quota == nil then return nil end
   for key, limit in pairs(quota) do
      local want = tres[key] or 0
      if want > limit then
         return string.format(
            "hetrun policy: job asks for %s=%d but account %s's quota is GrpTRES %s=%d; " ..
            "ask for at most %d, or submit under another account", key, want, account, key, limit, limit)
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
   local tres = job_tres(job_desc)
   if account ~= nil then
      local msg = over_quota(account, tres)
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
