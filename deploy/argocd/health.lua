-- Argo CD health of a flyte.org/TaskAction, read from status.phase and the error
-- fields (status.error, status.attempts, status.nextAttemptAt), which every executor
-- release writes. It uses no standard library beyond Argo CD's defaults (no string
-- library): install it with resource.customizations.health.flyte.org_TaskAction.
local hs = {}

-- The attempt the status is about: attempts counts from 1 once the executor queued it.
local function attempt(st)
  if st.attempts ~= nil and st.attempts > 0 then
    return "attempt " .. st.attempts
  end
  return "attempt 1"
end

-- "code: message" of an execution error, or nil.
local function describe(err)
  if err == nil then
    return nil
  end
  local text = err.code
  if err.message ~= nil and err.message ~= "" then
    if text ~= nil and text ~= "" then
      text = text .. ": " .. err.message
    else
      text = err.message
    end
  end
  if text == "" then
    return nil
  end
  return text
end

-- The message of the status condition of type typ, or nil.
local function conditionMessage(st, typ)
  if st.conditions == nil then
    return nil
  end
  for _, c in ipairs(st.conditions) do
    if c.type == typ and c.message ~= nil and c.message ~= "" then
      return c.message
    end
  end
  return nil
end

local st = obj.status
if st == nil or st.phase == nil or st.phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the executor: the action has no status yet"
  return hs
end

local phase = st.phase

if phase == "Succeeded" then
  hs.status = "Healthy"
  if st.cacheStatus == "Hit" then
    hs.message = "Succeeded: outputs taken from the cache"
  else
    hs.message = "Succeeded on " .. attempt(st)
  end
  return hs
end

if phase == "Failed" or phase == "TimedOut" or phase == "Aborted" then
  hs.status = "Degraded"
  local why = describe(st.error) or conditionMessage(st, "Failed")
  if phase == "Aborted" and why == nil then
    why = "the action was deleted before it finished"
  end
  hs.message = phase .. " on " .. attempt(st)
  if why ~= nil then
    hs.message = hs.message .. ": " .. why
  end
  return hs
end

if phase ~= "Queued" and phase ~= "WaitingForResources" and phase ~= "Initializing" and phase ~= "Running" then
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. phase .. ": this health check predates it"
  return hs
end

-- Not finished. A deletion is recorded as Aborted once the executor has let go of the
-- attempt (Argo CD itself shows a deleted object as "Pending deletion" before asking
-- this script). status.observedGeneration needs no check: the spec is immutable, so the
-- generation moves only with a deletion.
hs.status = "Progressing"
if obj.metadata.deletionTimestamp ~= nil then
  hs.message = phase .. ", " .. attempt(st) .. ": deleted, waiting for the executor to abort it"
  return hs
end

hs.message = phase .. ", " .. attempt(st)
if st.nextAttemptAt ~= nil then
  -- A backoff: after a failed attempt (Queued, the next attempt's number) or a system
  -- failure retried in place (the phase it happened in).
  hs.message = hs.message .. ": backing off until " .. st.nextAttemptAt
  local why = describe(st.error)
  if why ~= nil then
    hs.message = hs.message .. " after " .. why
  end
  return hs
end
local detail = conditionMessage(st, "Progressing")
if detail ~= nil then
  hs.message = hs.message .. ": " .. detail
end
return hs
