-- KServe's payload logger as a wrk script: each request is one half of a prediction, a CloudEvent in
-- binary HTTP mode with the headers of pkg/logger/worker.go (as benchmarks/streams_ingest.py's
-- cloudevent() builds them), the request half then the response half, every id new.
-- wrk -s benchmarks/cloudevents_logger.lua URL -- PATH KEY PREFIX [DELAY_MS]

local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local path, key, prefix, delay_ms
local counter = 0
local request_body = '{"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32", "data": [[6.8, 2.8, 4.8, 1.4]]}]}'
local response_body = '{"model_name": "ce", "id": "%s", "outputs": [{"name": "predict_proba", "shape": [1, 2], "datatype": "FP64", "data": [0.6, 0.4]}]}'

function init(args)
  path, key, prefix = args[1], args[2], args[3] .. "-" .. tid
  delay_ms = tonumber(args[4] or "0")
  if delay_ms > 0 then
    delay = function() return delay_ms end
  end
  -- wrk calls the first thread's request() once, unsent, to check it: let that call be a response
  -- half whose request half is never sent, so that no half goes out without its other half.
  if tid == 1 then
    counter = -1
  end
end

function request()
  counter = counter + 1
  local kind = (counter % 2 == 1) and "request" or "response"
  local id = prefix .. "-" .. math.floor((counter + 1) / 2)
  local headers = {
    ["Authorization"] = "Bearer " .. key,
    ["ce-id"] = id,
    ["ce-type"] = "org.kubeflow.serving.inference." .. kind,
    ["ce-source"] = "http://localhost:9081/",
    ["ce-specversion"] = "1.0",
    ["ce-time"] = "2026-01-01T00:00:00Z",
    ["content-type"] = "application/json",
    ["ce-inferenceservicename"] = "ce",
    ["ce-namespace"] = "default",
    ["ce-component"] = "predictor",
    ["ce-endpoint"] = "",
    ["ce-metadata"] = "{}",
    ["ce-recordedtime"] = "2026-01-01T00:00:00Z",
  }
  local body = kind == "request" and request_body or string.format(response_body, id)
  return wrk.format("POST", path, headers, body)
end
