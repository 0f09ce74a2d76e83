// Host-side check of the copy protocol of the persistent square forward and dQ pass
// (csrc/include/nattn/sm90/square_runs.cuh and its two kernels;
// runs on the CPU, no GPU). It replays random runs of boxes through four warps and the copy
// engine, interleaved at random (each step one warp action or one copy landing; copies land
// in any order), every other run as the dQ pass:
//   - the warps' walks: per box and warp a first key row sy (0..4) and a chunk count, the
//     parts each chunk waits for (square_first_part / square_last_part), the counts of the
//     parts each warp is past (the kernel's release_upto order: the skipped part 0 before the
//     walk, the rest after each chunk and at the end) and of the Q fragments read;
//   - a count's fourth warp copies the sequence's part three on into the same slot (parts 3
//     and 4 of the box, or the next box's parts 0-2 in slot (rot + 5 + j) mod 3), after the
//     counted part has landed; the last Q reader copies the next box's Q rows (or arrives on
//     the barrier at the run's end);
//   - the dQ pass: the last Q reader copies the box's dO rows into the query tile instead,
//     and the last warp to read them finds the next box and copies its Q rows (or arrives).
// It checks: every chunk reads its rows from the slots square_run_ring_row names, holding
// those very parts of that box, landed; the query tile holds the box's Q (dO) when read; no
// copy lands in a slot (or the query tile) a warp still reads; a copy of the next box's parts
// comes after its run entry was written; each barrier is armed once a box, in
// order, and a waiter never sees a phase two ahead of its own (the parity wait would pass
// wrongly); counts of two boxes never mix (even and odd boxes count apart: each count of box k lies in
// 4 (k / 2) .. + 3 of its parity's); the
// run ends with nothing in flight after the final waits, and never deadlocks.
// Then the runs' boxes: on random square problems (with and without a query range, several
// heads, KV heads and batch entries) and run lengths, the CTAs' walks with square_run_box (the
// forward and dQ pass) and square_dkv_run_box (the dK/dV pass) visit every box the whole-box
// grid runs (cta_tile / cta_tile_inverse true) exactly once, with its tile, head and batch.
// Prints "ok <steps> <boxes>" or the first failure (exit 1).
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "nattn/sm90/backward_dkv_squares_persistent.cuh"
#include "nattn/sm90/square_runs.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x51a7e0c3d2b94e17ull
#include "host_rng.h"
#include "sm90_problems.h"

constexpr int kWarps = 4, kParts = kSquareParts, kSlots = kSquareRingParts;

struct Copy {
  int kind;  // 0: a part (box, part) into slot; 1: Q rows of box; 2: dO rows of box
  int box, part, slot;
};

struct Warp {
  int box = 0;     // current box
  // 0 wait for Q and read it, 1 count Q, (dQ:) 6 wait for dO and read it, 7 count dO,
  // 3 wait for a chunk's parts, 4 read them, 5 count parts
  int stage = 0;
  int read_q = -1, read_g = -1;  // the last box whose Q / dO rows the warp read
  int ch = 0;
  int released = 0;
  int pend_q = -1;  // release_upto: the part being counted (its refill may wait)
  int upto = 0;
  bool finished = false;
};

static int failed = 0;
static void fail(const char* what, int run, int box, int warp, int part) {
  if (!failed) printf("FAIL %s: run %d box %d warp %d part %d\n", what, run, box, warp, part);
  failed = 1;
}

static bool same_tile(const CtaTile& x, const CtaTile& y) {  // (the decoders fill the 2-D axes only)
  for (int a = 0; a < 2; ++a)
    if (x.g[a] != y.g[a] || x.q0[a] != y.q0[a] || x.len[a] != y.len[a] || x.lo[a] != y.lo[a] || x.nk[a] != y.nk[a])
      return false;
  return x.tiles == y.tiles;
}

// The CTAs' walks over runs of `run` boxes (of `per` a batch entry and head, `heads` heads)
// against the whole-box grid: `expect(i, tile)` decodes box i within its (batch, head), and
// `walk(index, end, box)` is the kernels' next-box search. Returns the boxes visited, -1 on
// a failure.
template <class Expect, class Walk>
static long long check_run_boxes(const char* what, const Params& p, int per, int heads, int run, Expect&& expect,
                                 Walk&& walk) {
  const int boxes = per * heads * p.batch;
  std::vector<int> seen(boxes, 0);
  long long visited = 0;
  for (int begin = 0; begin < boxes; begin += run) {  // (a CTA's run: the launcher's grid)
    const int end = begin + run < boxes ? begin + run : boxes;
    SquareRunBox box;
    for (walk(begin, end, box); box.index >= 0; walk(box.index + 1, end, box)) {
      if (box.index < begin || box.index >= end || seen[box.index]++) {
        printf("FAIL %s: box %d outside its run or visited twice\n", what, box.index);
        return -1;
      }
      CtaTile want;
      const int hb = box.index / per;
      if (!expect(box.index - hb * per, want) || !same_tile(want, box.tile) || box.h != hb % heads ||
          box.b != hb / heads) {
        printf("FAIL %s: box %d decoded unlike the whole-box grid\n", what, box.index);
        return -1;
      }
      ++visited;
    }
  }
  for (int i = 0; i < boxes; ++i) {
    CtaTile t;
    if (!seen[i] && expect(i % per, t)) {
      printf("FAIL %s: box %d with queries never visited\n", what, i);
      return -1;
    }
  }
  return visited;
}

static long long check_boxes() {
  long long visited = 0;
  for (int it = 0; it < 600; ++it) {
    Params p = square_problem();
    if (rnd(0, 2) == 0) {  // a halo rank's query range on one axis
      const int a = rnd(0, 1);
      p.q_lo[a] = rnd(0, p.spatial[a] - 1);
      p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
    }
    p.batch = rnd(1, 3);
    p.heads_kv = rnd(1, 3);
    p.groups = rnd(1, 2);
    p.heads = p.heads_kv * p.groups;
    const int run = rnd(1, 9);
    using QB = Box<8, 8, 1>;
    set_query_boxes<QB>(p);
    p.cta_tiles = int(num_cta_tiles<QB>(p));
    const long long q = check_run_boxes(
        "query boxes", p, p.cta_tiles, p.heads, run,
        [&](int i, CtaTile& t) { return cta_tile<2, QB, Box<kSquareKeyBox, kSquareKeyBox, 1>>(p, unsigned(i), t); },
        [&](int index, int end, SquareRunBox& out) {
          square_run_box<2, QB, Box<kSquareKeyBox, kSquareKeyBox, 1>>(p, index, end, out);
        });
    if (q < 0) return -1;
    visited += q;
    for (int wide = 0; wide < 2; ++wide) {
      long long k;
      if (wide) {
        using KB = SquareDkvBox<true>::Keys;
        p.cta_tiles = int(num_key_ctas<KB>(p));
        k = check_run_boxes(
            "key boxes (4 x 16)", p, p.cta_tiles, p.heads_kv, run,
            [&](int i, CtaTile& t) { return cta_tile_inverse<2, KB, Box<1, 1, 1>>(p, unsigned(i), t); },
            [&](int index, int end, SquareRunBox& out) { square_dkv_run_box<true>(p, index, end, out); });
      } else {
        using KB = SquareDkvBox<false>::Keys;
        p.cta_tiles = int(num_key_ctas<KB>(p));
        k = check_run_boxes(
            "key boxes (8 x 8)", p, p.cta_tiles, p.heads_kv, run,
            [&](int i, CtaTile& t) { return cta_tile_inverse<2, KB, Box<1, 1, 1>>(p, unsigned(i), t); },
            [&](int index, int end, SquareRunBox& out) { square_dkv_run_box<false>(p, index, end, out); });
      }
      if (k < 0) return -1;
      visited += k;
    }
  }
  return visited;
}

int main() {
  long long steps = 0;
  for (int run = 0; run < 4000 && !failed; ++run) {
    const int boxes = rnd(1, 7);
    const bool dq = run % 2 == 1;  // the dQ pass: Q, then dO, then the next Q in the query tile
    // each box and warp: first key row and chunks (rows sy .. sy + 4 chunks - 1 inside the 20)
    std::vector<int> sy(boxes * kWarps), chunks(boxes * kWarps);
    for (int i = 0; i < boxes * kWarps; ++i) {
      sy[i] = rnd(0, 4);
      chunks[i] = rnd(1, (kSquareKeyBox - sy[i]) / kStripChunkRows);
    }
    // state
    int slot_box[kSlots], slot_part[kSlots];
    bool slot_landed[kSlots];
    int tile_kind = -1, tile_box = -1;  // the query tile: kind 1 Q, 2 dO rows of tile_box
    bool tile_landed = false;
    int completed[kParts] = {0}, armed[kParts] = {0};  // phases completed / armed per part barrier
    int q_completed = 0, q_armed = 0, g_completed = 0, g_armed = 0;
    int counts[2][kParts] = {{0}}, q_count = 0, g_count = 0;
    int next_written = 0;  // run entries written: boxes 0 .. next_written - 1 (and the end)
    std::vector<Copy> flight;
    Warp w[kWarps];
    auto issue_part = [&](int box, int part, int slot, int wi) {
      if (armed[part] != box) fail("part barrier armed out of order", run, box, wi, part);
      if (completed[part] != box) fail("part barrier armed before its previous phase completed", run, box, wi, part);
      armed[part] = box + 1;
      for (int x = 0; x < kWarps; ++x)  // no warp may still read the slot's current part
        if (!w[x].finished && w[x].stage == 4) {
          const int b = w[x].box, i = b * kWarps + x;
          const int f = square_first_part(sy[i], w[x].ch), l = square_last_part(sy[i], w[x].ch);
          const int rot = (2 * b) % kSlots;
          for (int pp = f; pp <= l; ++pp)
            if ((rot + pp) % kSlots == slot) fail("copy into a slot a warp reads", run, box, wi, part);
        }
      slot_box[slot] = box;
      slot_part[slot] = part;
      slot_landed[slot] = false;
      flight.push_back({0, box, part, slot});
    };
    // a copy into the query tile: every warp read what it holds (Q, or the dQ pass's dO, of
    // box - 1 for the next Q; Q of the box for its dO)
    auto tile_copy = [&](int kind, int box, int wi) {
      for (int x = 0; x < kWarps; ++x) {
        if (w[x].finished) continue;
        const bool read = kind == 2 ? w[x].read_q >= box : (dq ? w[x].read_g : w[x].read_q) >= box - 1;
        if (!read) fail("query tile copy before every warp read what it holds", run, box, wi, -1);
      }
      tile_kind = kind;
      tile_box = box;
      tile_landed = false;
      flight.push_back({kind, box, -1, -1});
    };
    auto issue_q = [&](int box, int wi) {
      if (q_armed != box || q_completed != box) fail("Q barrier armed out of order", run, box, wi, -1);
      q_armed = box + 1;
      tile_copy(1, box, wi);
    };
    auto issue_g = [&](int box, int wi) {
      if (g_armed != box || g_completed != box) fail("dO barrier armed out of order", run, box, wi, -1);
      g_armed = box + 1;
      tile_copy(2, box, wi);
    };
    // the last reader of the tile's Q (forward) or dO (dQ pass): the next box's entry, its Q
    auto next_q = [&](int k, int wi) {
      next_written = k + 2;
      if (k + 1 < boxes) issue_q(k + 1, wi);
      else {
        if (q_armed != k + 1) fail("end arrival out of order", run, k, wi, -1);
        q_armed = k + 2;
        q_completed = k + 2;  // (arrive: the phase completes)
      }
    };
    // the first box: Q and parts 0-2 (thread 0, before the loop)
    next_written = 1;
    issue_q(0, -1);
    for (int i = 0; i < kSlots; ++i) issue_part(0, i, i, -1);
    int done_warps = 0;
    for (long long guard = 0; done_warps < kWarps && !failed; ++guard) {
      if (guard > 200000) { fail("no progress (deadlock)", run, -1, -1, -1); break; }
      // runnable actions: each warp's next action, each copy's landing
      std::vector<int> acts;
      for (int x = 0; x < kWarps; ++x) {
        if (w[x].finished) continue;
        const Warp& v = w[x];
        bool ready = true;
        if (v.stage == 0) ready = q_completed >= v.box + 1;
        if (v.stage == 6) ready = g_completed >= v.box + 1;
        if (v.stage == 3) {
          const int i = v.box * kWarps + x;
          const int f = square_first_part(sy[i], v.ch), l = square_last_part(sy[i], v.ch);
          ready = completed[f] >= v.box + 1 && completed[l] >= v.box + 1;
        }
        if (v.stage == 5 && v.pend_q >= 0) ready = completed[v.pend_q] >= v.box + 1;  // the refill's wait
        if (ready) acts.push_back(x);
      }
      for (size_t c = 0; c < flight.size(); ++c) acts.push_back(kWarps + int(c));
      if (acts.empty()) { fail("deadlock", run, -1, -1, -1); break; }
      const int a = acts[rnd(0, int(acts.size()) - 1)];
      ++steps;
      if (a >= kWarps) {  // a copy lands
        const Copy c = flight[a - kWarps];
        flight.erase(flight.begin() + (a - kWarps));
        if (c.kind != 0) {
          if (tile_kind == c.kind && tile_box == c.box) tile_landed = true;
          int& done = c.kind == 1 ? q_completed : g_completed;
          if (done != c.box) fail("query tile phase order", run, c.box, -1, -c.kind);
          done = c.box + 1;
        } else {
          if (slot_box[c.slot] == c.box && slot_part[c.slot] == c.part) slot_landed[c.slot] = true;
          if (completed[c.part] != c.box) fail("part phase order", run, c.box, -1, c.part);
          completed[c.part] = c.box + 1;
        }
        continue;
      }
      Warp& v = w[a];
      const int k = v.box, i = k * kWarps + a;
      switch (v.stage) {
        case 0:  // Q landed (or the run's end)
          if (q_completed > k + 1) fail("Q waiter two phases behind", run, k, a, -1);
          if (k >= boxes) { v.finished = true; ++done_warps; break; }
          if (tile_kind != 1 || tile_box != k || !tile_landed) fail("query tile does not hold the box's Q", run, k, a, -1);
          v.read_q = k;
          v.stage = 1;
          break;
        case 1:  // the Q count; the last reader copies the next box's Q or arrives (dQ: the box's dO)
          if (q_count / 4 != k) fail("Q counts of two boxes mix", run, k, a, -1);
          if (q_count++ % 4 == 3) {
            if (dq) issue_g(k, a);
            else next_q(k, a);
          }
          if (dq) {
            v.stage = 6;
            break;
          }
          v.released = 0;
          v.upto = square_first_part(sy[i], 0);
          v.stage = 5;
          v.ch = -1;
          break;
        case 6:  // dO landed
          if (g_completed > k + 1) fail("dO waiter two phases behind", run, k, a, -1);
          if (tile_kind != 2 || tile_box != k || !tile_landed) fail("query tile does not hold the box's dO", run, k, a, -1);
          v.read_g = k;
          v.stage = 7;
          break;
        case 7:  // the dO count; the last reader copies the next box's Q (or arrives)
          if (g_count / 4 != k) fail("dO counts of two boxes mix", run, k, a, -1);
          if (g_count++ % 4 == 3) next_q(k, a);
          v.released = 0;
          v.upto = square_first_part(sy[i], 0);
          v.stage = 5;
          v.ch = -1;
          break;
        case 3:  // the chunk's parts landed
          for (int pp = square_first_part(sy[i], v.ch); pp <= square_last_part(sy[i], v.ch); ++pp)
            if (completed[pp] > k + 1) fail("part waiter two phases behind", run, k, a, pp);
          v.stage = 4;
          break;
        case 4: {  // read the chunk's rows from their slots
          const int rot = (2 * k) % kSlots;
          for (int r = 0; r < kStripChunkRows; ++r) {
            const int row = sy[i] + kStripChunkRows * v.ch + r, part = row / kSquarePartRows;
            const int ring = square_run_ring_row(row + kSquarePartRows * rot);
            const int slot = ring / kSquarePartRows;
            if (ring % kSquarePartRows != row % kSquarePartRows) fail("ring row phase", run, k, a, part);
            if (slot_box[slot] != k || slot_part[slot] != part || !slot_landed[slot])
              fail("chunk reads a slot not holding its landed part", run, k, a, part);
          }
          v.upto = v.ch + 1 < chunks[i] ? square_first_part(sy[i], v.ch + 1) : kParts;
          v.stage = 5;
          break;
        }
        case 5: {  // release_upto: count parts released .. upto - 1, refills by the fourth
          if (v.pend_q >= 0) {  // the counted part landed: the refill
            const int q = v.pend_q, rot = (2 * k) % kSlots;
            if (slot_box[(rot + q) % kSlots] != k || slot_part[(rot + q) % kSlots] != q)
              fail("refilled slot does not hold the counted part", run, k, a, q);
            if (q + kSlots < kParts) issue_part(k, q + kSlots, (rot + q + kSlots) % kSlots, a);
            else if (k + 1 < boxes) {
              if (next_written < k + 2) fail("next box's part copied before its run entry", run, k, a, q);
              const int j = q + kSlots - kParts;
              issue_part(k + 1, j, ((rot + kParts) % kSlots + j) % kSlots, a);
            }
            v.pend_q = -1;
            ++v.released;
            break;
          }
          if (v.released < v.upto) {
            const int q = v.released;
            int& n = counts[k & 1][q];
            if (n / 4 != k / 2) fail("part counts of two boxes mix", run, k, a, q);
            if (n++ % 4 == 3) { v.pend_q = q; break; }
            ++v.released;
            break;
          }
          if (v.ch + 1 < chunks[i]) { ++v.ch; v.stage = 3; }  // (after the last chunk upto is kParts)
          else { v.stage = 0; ++v.box; v.ch = 0; }
          break;
        }
      }
    }
    if (failed) break;
    // thread 0's final waits: every part of the last box landed, nothing else in flight
    for (int p = 0; p < kParts; ++p)
      if (armed[p] != boxes) fail("a part of the last box never copied", run, boxes - 1, -1, p);
    while (!flight.empty() && !failed) {
      const Copy c = flight.back();
      flight.pop_back();
      if (c.kind == 1 || c.box != boxes - 1) fail("a copy other than the last box's parts in flight at the end", run, c.box, -1, c.part);
    }
  }
  if (failed) return 1;
  const long long boxes = check_boxes();
  if (boxes < 0) return 1;
  printf("ok %lld %lld\n", steps, boxes);
  return 0;
}
