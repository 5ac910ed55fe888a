// ZeroPartition is flat-range arithmetic over nn's ParamSet, so it lives in nn (below checkpoint, which reads it);
// this path stays for the ZeRO headers that still include it.
#pragma once
#include "dscpp/nn/zero_partition.h"
