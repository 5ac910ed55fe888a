#!/usr/bin/env python3
"""Writes tests/data/quant_formats.safetensors: int4 and fp8 linears in the layouts quantized Hugging Face checkpoints use,
packed the way their own writers pack them, with the f32 weight each one dequantizes to, for test_quant_formats.
Pure Python (no numpy / torch): an independent writer of the published formats, not our code run backwards.

  awq.*       AutoAWQ's GEMM layout (quantization_config quant_method "awq", version "gemm"): qweight i32 [C, OC/8],
              eight output columns a word, nibble i holding column 8k + (0, 2, 4, 6, 1, 3, 5, 7)[i]; qzeros i32
              [C/G, OC/8] packed the same way; scales f16 [C/G, OC]; w[o, c] = (q - zero) * scale per group of G
              input columns.
  gptq.*      AutoGPTQ's layout (quant_method "gptq", checkpoint_format "gptq", desc_act false): qweight i32
              [C/8, OC], eight input rows a word, nibble j holding row 8k + j; qzeros i32 [C/G, OC/8], zero - 1
              packed along the output columns in order; scales f16 [C/G, OC]; g_idx i32 [C] = c / G.
  gptq_sym.*  the same, symmetric (every zero point 8), GPTQ's default.
  fp8.*       compressed-tensors' fp8 ("float-quantized", strategy "channel"): weight F8_E4M3 [OC, C] (OCP e4m3 codes,
              every one but NaN, decoded here from the format's definition), weight_scale BF16 [OC, 1].
  fp8t.*      the same with strategy "tensor": weight_scale F32 [1].
  *.expect    f32 [OC, C]: the dequantized weight, computed here in double and exact in f32.
Run: python3 tests/data/gen_quant_formats.py (rewrites the file; it is committed)."""
import json
import os
import random
import struct

OC, C, G = 48, 256, 64
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def f16(x):
    return struct.unpack('<e', struct.pack('<e', x))[0]  # round to half precision


def quantize(rng, sym, min_zero):
    """q[o][c] in 0..15, zero[g][o], scale[g][o] (f16 values) of a random weight."""
    scale = [[f16(rng.uniform(0.002, 0.03)) for _ in range(OC)] for _ in range(C // G)]
    zero = [[8 if sym else rng.randint(min_zero, 15) for _ in range(OC)] for _ in range(C // G)]
    q = [[rng.randint(0, 15) for _ in range(C)] for _ in range(OC)]
    expect = [[(q[o][c] - zero[c // G][o]) * scale[c // G][o] for c in range(C)] for o in range(OC)]
    return q, zero, scale, expect


def i32(words):
    return b''.join(struct.pack('<I', w & 0xFFFFFFFF) for w in words)


def awq(q, zero):
    qweight = []  # [C][OC/8]
    for c in range(C):
        for k in range(OC // 8):
            w = 0
            for i in range(8):
                w |= q[8 * k + AWQ_ORDER[i]][c] << (4 * i)
            qweight.append(w)
    qzeros = []
    for g in range(C // G):
        for k in range(OC // 8):
            w = 0
            for i in range(8):
                w |= zero[g][8 * k + AWQ_ORDER[i]] << (4 * i)
            qzeros.append(w)
    return {'qweight': ('I32', [C, OC // 8], i32(qweight)), 'qzeros': ('I32', [C // G, OC // 8], i32(qzeros))}


def gptq(q, zero):
    qweight = []  # [C/8][OC]
    for r in range(C // 8):
        for o in range(OC):
            w = 0
            for j in range(8):
                w |= q[o][8 * r + j] << (4 * j)
            qweight.append(w)
    qzeros = []
    for g in range(C // G):
        for k in range(OC // 8):
            w = 0
            for j in range(8):
                w |= (zero[g][8 * k + j] - 1) << (4 * j)  # checkpoint_format "gptq" stores zero - 1
            qzeros.append(w)
    g_idx = [c // G for c in range(C)]
    return {'qweight': ('I32', [C // 8, OC], i32(qweight)), 'qzeros': ('I32', [C // G, OC // 8], i32(qzeros)),
            'g_idx': ('I32', [C], i32(g_idx))}


def common(zero, scale, expect):
    return {'scales': ('F16', [C // G, OC], b''.join(struct.pack('<e', s) for row in scale for s in row)),
            'expect': ('F32', [OC, C], b''.join(struct.pack('<f', v) for row in expect for v in row))}


def e4m3(code):
    """The value of an OCP e4m3 ("E4M3FN") code: sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, mant = (code >> 3) & 15, code & 7
    if exp == 0:
        return sign * mant / 8.0 * 2.0 ** -6
    return sign * (1 + mant / 8.0) * 2.0 ** (exp - 7)


def bf16(x):
    """x rounded to bfloat16 (to nearest even), and its two bytes."""
    bits = struct.unpack('<I', struct.pack('<f', x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return struct.unpack('<f', struct.pack('<I', bits << 16))[0], struct.pack('<H', bits)


def fp8(rng, per_tensor):
    codes = [[rng.choice([c for c in range(256) if c & 0x7F != 0x7F]) for _ in range(C)] for _ in range(OC)]
    if per_tensor:
        s = struct.unpack('<f', struct.pack('<f', rng.uniform(0.0005, 0.002)))[0]
        scales, blob, shape = [s] * OC, struct.pack('<f', s), ('F32', [1])
    else:
        pairs = [bf16(rng.uniform(0.0005, 0.002)) for _ in range(OC)]
        scales, blob, shape = [v for v, _ in pairs], b''.join(b for _, b in pairs), ('BF16', [OC, 1])
    expect = [[e4m3(codes[o][c]) * scales[o] for c in range(C)] for o in range(OC)]  # exact in f32
    return {'weight': ('F8_E4M3', [OC, C], bytes(c for row in codes for c in row)),
            'weight_scale': (shape[0], shape[1], blob),
            'expect': ('F32', [OC, C], b''.join(struct.pack('<f', v) for row in expect for v in row))}


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header['__metadata__'] = {'group_size': str(G), 'writer': 'tests/data/gen_quant_formats.py'}
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def main():
    rng = random.Random(2026)
    tensors = {}
    for prefix, fmt, sym, min_zero in (('awq', awq, False, 0), ('gptq', gptq, False, 1), ('gptq_sym', gptq, True, 1)):
        # GPTQ's v1 format cannot hold a zero point of 0 (stored as -1, it spills into the next nibbles)
        q, zero, scale, expect = quantize(rng, sym, min_zero)
        for k, v in {**fmt(q, zero), **common(zero, scale, expect)}.items():
            tensors[prefix + '.' + k] = v
    rng = random.Random(2027)
    for prefix, per_tensor in (('fp8', False), ('fp8t', True)):
        for k, v in fp8(rng, per_tensor).items():
            tensors[prefix + '.' + k] = v
    write_safetensors(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'quant_formats.safetensors'), tensors)


if __name__ == '__main__':
    main()
