// ldlm: the layers of LDLM, the Latent Diffusion Language Model, in header-only C++.
// Include this umbrella header, or the individual headers in the order of the tree:
//   core/     tensors, errors, named parameters, thread pool and scratch arena, CPU
//             features, precision and bf16 values, comparison with a tolerance
//   ops/      primitive free functions (GEMM backends and packed weights, norms,
//             activations, rotary, attention)
//   nn/       modules owning named parameters (Linear, norms, FFNs, attention)
//   model/    the configuration, the five LDLM modules, self-describing checkpoints
//   sampling/ the diffusion schedule, the solvers, conditioning on known latents, the
//             sampler and the end-to-end pipeline
//   io/       the strict JSON reader, safetensors reading/writing, parameters by
//             state-dict name, GPT-2's tokenizer, text with <|mask|> markers
// and text_model.hpp, the text API (ldlm::TextModel), whose definitions are compiled
// once into the CMake target ldlm::text: a program that needs only text in and out
// includes <ldlm/text_model.hpp> alone, and compiles in about a second.
#pragma once

#include "ldlm/core/compare.hpp"
#include "ldlm/core/context.hpp"
#include "ldlm/core/cpu.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/init.hpp"
#include "ldlm/core/parameter.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/model/accounting.hpp"
#include "ldlm/model/checkpoint.hpp"
#include "ldlm/model/config.hpp"
#include "ldlm/model/model.hpp"
#include "ldlm/ops/gemm_report.hpp"
#include "ldlm/sampling/condition.hpp"
#include "ldlm/sampling/pipeline.hpp"
#include "ldlm/sampling/sampler.hpp"
#include "ldlm/sampling/schedule.hpp"
#include "ldlm/io/masked_text.hpp"
#include "ldlm/io/safetensors.hpp"
#include "ldlm/io/state_dict.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/text_model.hpp"
