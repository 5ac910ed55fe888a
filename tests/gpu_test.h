// GPU tests skip cleanly (not fail) in CPU-only builds and on machines without a CUDA device.
#pragma once
#include <gtest/gtest.h>

#include "dscpp/core/cuda.h"

#define DSCPP_REQUIRE_GPU() \
  if (!::dscpp::cuda_available()) GTEST_SKIP() << "no CUDA device"
