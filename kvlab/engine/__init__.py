"""The engine (lab 04 on): requests, the scheduler, the serving loop and the vLLM-like API.

request               Request and its states (waiting, running, swapped, finished)
sampling_params       SamplingParams: greedy, temperature, top-k, top-p, n, seed
sampler               turns logits into tokens, one seeded generator per sample
scheduler_config      SchedulerConfig: the batching knobs, checked where they are made
scheduler             who runs each step: running requests first, preemption (recompute or
                      swap), admission; the waiting queue (FCFS or by priority) and the
                      batching mode (static, dynamic, continuous); SchedulerOutput, one
                      step's plan
swap_planner          which blocks swap to CPU memory and back (the engine copies them)
llm_engine            LLMEngine.step: admit, allocate, compute (the plan packed into one
                      flat batch), sample (and fork), free; what add_request checks before
                      a request is queued, and the requests still to arrive
model_free            a stand-in for the model, for the engine's own loop at any scale
llm                   LLM: generate() for offline use, vLLM's names
kv_cache_setup        the KV cache LLM builds: num_blocks from a memory budget, like vLLM
outputs, metrics      what a request and a run return; TTFT, TPOT, throughput
step_stats            StepStats: what one step did (on_step callbacks receive it)
step_cost             StepWork, and a clock whose steps last what their work costs
"""
