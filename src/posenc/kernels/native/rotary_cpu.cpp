// RoPE on CPU tensors in one pass: posenc::rotary(xs, outs, cos, sin, interleaved, conjugate).
//
// RoPE (Su et al. 2021, arxiv.org/abs/2104.09864) turns pair k of a row at position p by theta = p * omega_k:
// (a, b) -> (a cos - b sin, a sin + b cos). Each x in xs is (..., seq, head_dim) with a unit last stride
// (q and k of a call may differ in head count and dtype); cos and sin are (..., seq, rotary_dim / 2), float32
// (float64 for float64 x), broadcast against each x's leading dimensions. Storage is float32, float64,
// bfloat16 or float16; the arithmetic is float32 (float64 for float64) and a 16-bit result is rounded once,
// to nearest even, as torch rounds. `conjugate` turns by -theta (the backward pass). outs[i] may be xs[i]
// itself (in place); otherwise dimensions past rotary_dim are copied.
//
// The rows of every x are one range of work for a single at::parallel_for, so a call opens at most one
// parallel region, whatever the number of tensors and heads. The inner loops are plain loops the compiler
// vectorises (built with -O3 -march=native by posenc.kernels.native.build); bfloat16 values are widened and
// rounded with integer bit operations, which vectorise where a call into c10's converters would not;
// float16 rows, and short bfloat16 rows, go through a float32 copy of the row.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int kMaxDims = 8;
// Below this many elements a call runs on its own thread: a tenth of a millisecond of work, where waking
// the others saves less than one busy neighbour's delay of a woken thread can cost (milliseconds).
constexpr int64_t kSerialElements = int64_t(1) << 20;
// Elements per chunk of work handed to a thread: 256 KiB of float32, within L2 with its tables.
constexpr int64_t kChunkElements = int64_t(1) << 16;
// Pairs per row at or below which bfloat16 rows are widened into float32 first (see widen_row).
constexpr int64_t kShortPairs = 8;

struct Float32 {
  using Storage = float;
  using Work = float;
  static Work load(Storage v) { return v; }
  static Storage store(Work v) { return v; }
};

struct Float64 {
  using Storage = double;
  using Work = double;
  static Work load(Storage v) { return v; }
  static Storage store(Work v) { return v; }
};

// bfloat16: the high half of a float32; rounding to nearest even, NaN kept quiet (c10's rule).
struct BFloat16 {
  using Storage = uint16_t;
  using Work = float;
  static Work load(Storage v) {
    uint32_t bits = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static Storage store(Work f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return f != f ? uint16_t(0x7fc0) : uint16_t(rounded);
  }
};

// float16 as the compiler's IEEE binary16 type: conversions round to nearest even. The compiler does not
// vectorise them, so float16 rows go through a float32 copy (widen_row / narrow_row, F16C where present).
struct Float16 {
  using Storage = _Float16;
  using Work = float;
  static Work load(Storage v) { return static_cast<float>(v); }
  static Storage store(Work v) { return static_cast<_Float16>(v); }
};

inline void widen_row(const _Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// bfloat16 rows the same way when they are short (head_dim 16 and less: the lab's shapes), where the fused
// loop's few iterations per row never reach a vector; these two loops vectorise at any length.
inline void widen_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16::load(src[i]);
}

inline void narrow_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16::store(src[i]);
}

inline void narrow_row(const float* src, _Float16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<_Float16>(src[i]);
}

// One row of h pairs. In place, src == dst: every pair is read before it is written and no two pairs
// share an element, so the iterations are independent (ivdep tells the vectoriser so).
template <class T, bool Interleaved>
inline void rotate_row(const typename T::Storage* src, typename T::Storage* dst,
                       const typename T::Work* __restrict__ c, const typename T::Work* __restrict__ s,
                       int64_t h, typename T::Work sign) {
  using W = typename T::Work;
  if (Interleaved) {
#pragma GCC ivdep
    for (int64_t i = 0; i < h; ++i) {
      W a = T::load(src[2 * i]), b = T::load(src[2 * i + 1]);
      W si = sign * s[i];
      dst[2 * i] = T::store(a * c[i] - b * si);
      dst[2 * i + 1] = T::store(b * c[i] + a * si);
    }
  } else {
#pragma GCC ivdep
    for (int64_t i = 0; i < h; ++i) {
      W a = T::load(src[i]), b = T::load(src[i + h]);
      W si = sign * s[i];
      dst[i] = T::store(a * c[i] - b * si);
      dst[i + h] = T::store(b * c[i] + a * si);
    }
  }
}

// Byte offsets of one row of x, out, cos and sin, walked in row-major order over x's leading dimensions.
struct RowWalk {
  int dims = 0;
  int64_t size[kMaxDims];
  int64_t stride[4][kMaxDims];  // x, out, cos, sin; in elements
  int64_t index[kMaxDims];
  int64_t offset[4];

  void seek(int64_t row) {
    for (int t = 0; t < 4; ++t) offset[t] = 0;
    for (int d = dims - 1; d >= 0; --d) {
      index[d] = row % size[d];
      row /= size[d];
      for (int t = 0; t < 4; ++t) offset[t] += index[d] * stride[t][d];
    }
  }

  void next() {
    for (int d = dims - 1; d >= 0; --d) {
      for (int t = 0; t < 4; ++t) offset[t] += stride[t][d];
      if (++index[d] < size[d]) return;
      for (int t = 0; t < 4; ++t) offset[t] -= size[d] * stride[t][d];
      index[d] = 0;
    }
  }
};

struct Job {
  at::Tensor x, out, cos, sin;
  RowWalk walk;
  int64_t rows, head_dim, half;
};

template <class T, bool Interleaved>
void rotate_rows(Job& job, int64_t begin, int64_t end, bool conjugate) {
  using S = typename T::Storage;
  using W = typename T::Work;
  const S* x = reinterpret_cast<const S*>(job.x.const_data_ptr());
  S* out = reinterpret_cast<S*>(job.out.mutable_data_ptr());
  const W* c = job.cos.const_data_ptr<W>();
  const W* s = job.sin.const_data_ptr<W>();
  const int64_t h = job.half, r = 2 * h, tail = job.head_dim - r;
  const bool copy_tail = tail > 0 && job.out.data_ptr() != job.x.data_ptr();
  const W sign = conjugate ? W(-1) : W(1);
  RowWalk walk = job.walk;
  walk.seek(begin);
  constexpr bool sixteen = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;
  const bool widened = std::is_same_v<T, Float16> || (sixteen && h <= kShortPairs);
  std::vector<float> scratch(widened ? r : 0);
  for (int64_t row = begin; row < end; ++row, walk.next()) {
    const S* src = x + walk.offset[0];
    S* dst = out + walk.offset[1];
    if constexpr (!sixteen) {
      rotate_row<T, Interleaved>(src, dst, c + walk.offset[2], s + walk.offset[3], h, sign);
    } else if (widened) {
      widen_row(src, scratch.data(), r);
      rotate_row<Float32, Interleaved>(scratch.data(), scratch.data(), c + walk.offset[2], s + walk.offset[3], h,
                                       sign);
      narrow_row(scratch.data(), dst, r);
    } else {
      rotate_row<T, Interleaved>(src, dst, c + walk.offset[2], s + walk.offset[3], h, sign);
    }
    if (copy_tail) std::memcpy(dst + r, src + r, tail * sizeof(S));
  }
}

template <class T>
void rotate_rows_of(Job& job, int64_t begin, int64_t end, bool interleaved, bool conjugate) {
  if (interleaved) {
    rotate_rows<T, true>(job, begin, end, conjugate);
  } else {
    rotate_rows<T, false>(job, begin, end, conjugate);
  }
}

void rotate_range(Job& job, int64_t begin, int64_t end, bool interleaved, bool conjugate) {
  switch (job.x.scalar_type()) {
    case at::kFloat: return rotate_rows_of<Float32>(job, begin, end, interleaved, conjugate);
    case at::kDouble: return rotate_rows_of<Float64>(job, begin, end, interleaved, conjugate);
    case at::kBFloat16: return rotate_rows_of<BFloat16>(job, begin, end, interleaved, conjugate);
    case at::kHalf: return rotate_rows_of<Float16>(job, begin, end, interleaved, conjugate);
    default: TORCH_CHECK(false, "posenc::rotary: unsupported dtype ", job.x.scalar_type());
  }
}

Job make_job(const at::Tensor& x, const at::Tensor& out, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "posenc::rotary: CPU tensors only");
  TORCH_CHECK(x.dim() >= 2 && x.dim() - 1 <= kMaxDims, "posenc::rotary: x must be (..., seq, head_dim) with at most ",
              kMaxDims - 1, " leading dimensions, got ", x.sizes());
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "posenc::rotary: out must be shaped and typed like x");
  TORCH_CHECK(x.stride(-1) == 1 && out.stride(-1) == 1, "posenc::rotary: x and out need a unit last stride");
  const int64_t half = cos.size(-1);
  TORCH_CHECK(sin.sizes() == cos.sizes(), "posenc::rotary: cos and sin must have one shape");
  TORCH_CHECK(2 * half <= x.size(-1), "posenc::rotary: rotary_dim ", 2 * half, " exceeds head_dim ", x.size(-1));
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(cos.scalar_type() == work && sin.scalar_type() == work, "posenc::rotary: tables must be ", work,
              " for ", x.scalar_type(), " x");
  TORCH_CHECK(cos.stride(-1) == 1 && sin.stride(-1) == 1, "posenc::rotary: tables need a unit last stride");
  Job job;
  job.x = x;
  job.out = out;
  job.cos = cos;
  job.sin = sin;
  job.head_dim = x.size(-1);
  job.half = half;
  job.rows = 1;
  RowWalk& walk = job.walk;
  walk.dims = int(x.dim()) - 1;
  // the tables broadcast against x's leading dimensions, aligned from the right (stride 0 where they are 1
  // or missing): strides read off directly, no expanded tensor made per call
  const int64_t lead = cos.dim() - 1;
  TORCH_CHECK(lead <= walk.dims, "posenc::rotary: tables ", cos.sizes(), " have more dimensions than x ", x.sizes());
  for (int d = 0; d < walk.dims; ++d) {
    walk.size[d] = x.size(d);
    job.rows *= x.size(d);
    walk.stride[0][d] = x.stride(d);
    walk.stride[1][d] = out.stride(d);
    const int64_t t = d - (walk.dims - lead);  // the tables' matching dimension, if any
    for (int which = 0; which < 2; ++which) {
      const at::Tensor& table = which == 0 ? cos : sin;
      const bool broadcast = t < 0 || table.size(t) == 1;
      TORCH_CHECK(broadcast || table.size(t) == x.size(d), "posenc::rotary: tables ", table.sizes(),
                  " do not broadcast against x ", x.sizes());
      walk.stride[2 + which][d] = broadcast ? 0 : table.stride(t);
    }
  }
  return job;
}

void rotary(at::TensorList xs, at::TensorList outs, const at::Tensor& cos, const at::Tensor& sin,
            bool interleaved, bool conjugate) {
  TORCH_CHECK(xs.size() == outs.size(), "posenc::rotary: as many outs as xs");
  std::vector<Job> jobs;
  std::vector<int64_t> starts{0};
  for (size_t i = 0; i < xs.size(); ++i) {
    jobs.push_back(make_job(xs[i], outs[i], cos, sin));
    if (jobs.back().half == 0 && jobs.back().out.data_ptr() != jobs.back().x.data_ptr()) {
      jobs.back().out.copy_(jobs.back().x);
    }
    starts.push_back(starts.back() + (jobs.back().half == 0 ? 0 : jobs.back().rows));
  }
  const int64_t total = starts.back();
  if (total == 0) return;
  auto run = [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t lo = std::max(begin, starts[i]), hi = std::min(end, starts[i + 1]);
      if (lo < hi) rotate_range(jobs[i], lo - starts[i], hi - starts[i], interleaved, conjugate);
    }
  };
  const int64_t width = std::max<int64_t>(1, jobs[0].head_dim);
  if (total * width < kSerialElements || at::get_num_threads() == 1 || at::in_parallel_region()) {
    run(0, total);
    return;
  }
  // Chunks are handed out as threads ask for them, not split up front: a thread the scheduler delays (a
  // busy neighbour on the same cores) holds back the call by one chunk, not by half the tensor.
  const int64_t rows = std::max<int64_t>(1, kChunkElements / width);
  const int64_t chunks = (total + rows - 1) / rows;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      run(c * rows, std::min(total, (c + 1) * rows));
    }
  });
}

}  // namespace

TORCH_LIBRARY(posenc, m) {
  m.def("rotary(Tensor[] xs, Tensor(a!)[] outs, Tensor cos, Tensor sin, bool interleaved, bool conjugate) -> ()");
}

TORCH_LIBRARY_IMPL(posenc, CPU, m) { m.impl("rotary", &rotary); }
