#include "attention_nodes/scheduler/scheduler_metrics.h"

namespace k3 {

SchedulerStepMetrics::SchedulerStepMetrics(MetricsRegistry& registry)
    : fixed(registry
                .AddGauge("k3_attention_step_fixed_seconds",
                          "Fitted fixed cost of a model step (StepBudget).")
                .Get()),
      per_token(registry
                    .AddGauge("k3_attention_step_per_token_seconds",
                              "Fitted cost of one more token in a model step.")
                    .Get()),
      target(registry
                 .AddGauge("k3_attention_step_target_seconds",
                           "The step time the prompt budget aims at while streams "
                           "decode.")
                 .Get()),
      ping_pong(registry
                    .AddCounter("k3_attention_ping_pong_steps_total",
                                "Steps run as two ping-pong micro-batches.")
                    .Get()),
      seconds(registry
                  .AddHistogram("k3_attention_step_seconds",
                                "Wall time of one batched model step.",
                                ExponentialBuckets(0.0005, 2, 16))
                  .Get()),
      compute(registry
                  .AddHistogram("k3_attention_step_compute_seconds",
                                "Time of one model step spent computing here (attention, "
                                "dense layer, shared experts, LM head): the step's wall "
                                "time less its MoE wait.",
                                ExponentialBuckets(0.0005, 2, 16))
                  .Get()),
      moe_wait(registry
                   .AddHistogram("k3_attention_step_moe_wait_seconds",
                                 "Time of one model step spent sending MoE layers' rows "
                                 "and waiting for the routed answers, over all layers.",
                                 ExponentialBuckets(0.0005, 2, 16))
                   .Get()),
      layer_moe_wait(registry
                         .AddHistogram("k3_attention_layer_moe_wait_seconds",
                                       "Sending one MoE layer's rows and waiting for its "
                                       "routed answer (one observation per MoE layer of a "
                                       "step).",
                                       ExponentialBuckets(1e-5, 2, 20))
                         .Get()),
      tokens(registry
                 .AddHistogram("k3_attention_step_tokens",
                               "Tokens (decode tokens plus prefill chunks) per model step.",
                               ExponentialBuckets(1, 2, 14))
                 .Get()) {}

SchedulerMetrics::SchedulerMetrics(MetricsRegistry& registry)
    : requests(registry.AddCounter("k3_attention_requests_total",
                                   "Generation requests ended, by finish reason.",
                                   {"finish_reason"})),
      rejected(registry
                   .AddCounter("k3_attention_rejected_requests_total",
                               "Generation requests rejected before they started.")
                   .Get()),
      prompt_tokens(
          registry.AddCounter("k3_attention_prompt_tokens_total", "Prompt tokens prefilled.")
              .Get()),
      generated_tokens(registry
                           .AddCounter("k3_attention_generated_tokens_total",
                                       "Tokens generated and streamed.")
                           .Get()),
      active(registry
                 .AddGauge("k3_attention_active_requests",
                           "Generation requests submitted and not yet finished.")
                 .Get()),
      cached(registry
                 .AddGauge("k3_attention_cached_sequences",
                           "Requests holding KV/KDA state.")
                 .Get()),
      state_bytes(registry
                      .AddGauge("k3_attention_request_state_bytes",
                                "Bytes of KV/KDA state held for requests.")
                      .Get()),
      time_to_first_token(
          registry
              .AddHistogram("k3_attention_time_to_first_token_seconds",
                            "From a request's submission to its first token, for every "
                            "request that got one.",
                            ExponentialBuckets(0.001, 2, 16))
              .Get()),
      inter_token(registry
                      .AddHistogram("k3_attention_inter_token_seconds",
                                    "Between two consecutive tokens of one request (one "
                                    "observation per token after the first).",
                                    ExponentialBuckets(0.0005, 2, 16))
                      .Get()),
      request_seconds(registry
                          .AddHistogram("k3_attention_request_seconds",
                                        "End-to-end latency: from a request's submission to "
                                        "its end, whatever the finish reason.",
                                        ExponentialBuckets(0.01, 2, 14))
                          .Get()),
      step(registry) {}

}  // namespace k3
