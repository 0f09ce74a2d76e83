// Host-side check of the zero-padded copies' index math (runs on the CPU, no GPU): for random
// [B, *spatial, H, C] tensors (heads-last, sliced from a wider row, heads-first viewed
// heads-last, spatial axes stored in reverse) and instance head dims HD >= C, every item
// pad_copy_offsets gives (one 16-byte chunk) must address the element the tensor's strides
// give for its batch entry, token, head and channel part, and its packed row-major
// [B, N, H, HD] slot, item i of entry b being chunk i of that entry in packed order.
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/pad_copy.cuh"

using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x3c6ef372fe94f82bull
#include "host_rng.h"

template <int NA>
static int check_one(long long& checks) {
  int spatial[3] = {1, 1, 1};
  for (int a = 0; a < NA; ++a) spatial[a] = rnd(1, NA == 1 ? 300 : NA == 2 ? 24 : 9);
  const int heads = rnd(1, 5), batch = rnd(1, 3);
  const int hd = 32 << rnd(0, 3), channels = 8 * rnd(1, hd / 8);
  const int layout = rnd(0, 3);
  int64_t tokens = 1;
  for (int a = 0; a < NA; ++a) tokens *= spatial[a];
  // element strides of the layout (batch, axes 0..2, heads)
  int64_t s[5] = {0, 0, 0, 0, 0};
  const int64_t row = int64_t(heads) * channels + (layout == 1 ? 8 * rnd(1, 40) : 0);  // 1: a wider row
  if (layout == 2) {  // heads-first [B, H, *spatial, C]
    int64_t st = channels;
    for (int a = NA - 1; a >= 0; --a) { s[1 + a] = st; st *= spatial[a]; }
    s[4] = st;
    s[0] = st * heads;
  } else if (layout == 3) {  // [B, *reversed(spatial), H, C] viewed in order
    int64_t st = row;
    for (int a = 0; a < NA; ++a) { s[1 + a] = st; st *= spatial[a]; }
    s[4] = channels;
    s[0] = st;
  } else {
    int64_t st = row;
    for (int a = NA - 1; a >= 0; --a) { s[1 + a] = st; st *= spatial[a]; }
    s[4] = channels;
    s[0] = st;
  }
  PadCopy c;
  for (int k = 0; k < 5; ++k) c.s[k] = s[k];
  for (int a = 0; a < 3; ++a) c.spatial[a] = unsigned(spatial[a]);
  c.na_dim = NA;
  c.channels = channels;
  c.part_shift = 0;
  while ((8 << c.part_shift) < hd) ++c.part_shift;
  c.heads = unsigned(heads);
  c.items = unsigned(tokens * heads * (hd / 8));
  const int parts = hd / 8;
  for (int b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < tokens; ++t) {
      int coord[3] = {0, 0, 0};
      int64_t rest = t;
      for (int a = NA - 1; a >= 0; --a) { coord[a] = int(rest % spatial[a]); rest /= spatial[a]; }
      for (int h = 0; h < heads; ++h) {
        for (int part = 0; part < parts; ++part) {
          const unsigned i = unsigned((t * heads + h) * parts + part);
          int64_t want = int64_t(b) * s[0] + int64_t(h) * s[4] + part * 8;
          for (int a = 0; a < NA; ++a) want += int64_t(coord[a]) * s[1 + a];
          const int64_t want_packed = ((int64_t(b) * tokens + t) * heads + h) * hd + part * 8;
          int64_t got, got_packed;
          const unsigned got_part = pad_copy_offsets<NA>(c, unsigned(b), i, got, got_packed);
          ++checks;
          if (got_part != unsigned(part) || got_packed != want_packed || (part * 8 < channels && got != want)) {
            printf("na %d layout %d spatial %d,%d,%d heads %d C %d HD %d: item %u of entry %d (token %lld head %d "
                   "part %d) gives part %u strided %lld packed %lld, expected %lld / %lld\n", NA, layout, spatial[0],
                   spatial[1], spatial[2], heads, channels, hd, i, b, (long long)t, h, part, got_part,
                   (long long)got, (long long)got_packed, (long long)want, (long long)want_packed);
            return 1;
          }
        }
      }
    }
  }
  return 0;
}

int main() {
  long long checks = 0;
  for (int it = 0; it < 150; ++it)
    if (check_one<1>(checks) || check_one<2>(checks) || check_one<3>(checks)) return 1;
  printf("ok %lld\n", checks);
  return 0;
}
