// The fast recorder of streamsan.torch: a RecordFunction observer and the CUDA caching
// allocator's trace tracker, writing trace-format ops (JSON Lines) into a batch that Python hands
// to the Rust checker.
//
// Built on the machine that runs the program (torch.utils.cpp_extension), against its torch: a
// C++ extension has no stable ABI across torch versions.
//
// What it writes, per dispatcher op that touches CUDA memory or pinned host memory:
//   - a `launch` on the op's current stream with its reads and writes as regions of their
//     allocations (offset and extent of the view), named after the op, with the user's file:line;
//   - for a CPU op on pinned memory, `host_read` / `host_write`;
//   - `record_stream` for aten::record_stream, and for every non_blocking copy that reads or
//     writes pinned memory (PyTorch's host allocator records an event for it);
//   - `alloc` / `free` of device memory from the allocator's trace entries (real address, size
//     and owning stream), of pinned memory from the ops that return fresh pinned storage.
// Nested ops: an op's accesses already written by ops it called are not written again.
// Synchronizations (events, syncs) come from Python (torch.cuda._gpu_trace callbacks) through
// host_op(), in the order the thread issued them: those issued inside an op are written before
// the next op it calls begins, or, when it calls none after them, after the op's own launch (a
// host read's sync follows its copy).
//
// Identity is the allocator's: device buffers come from the caching allocator's trace (its
// frees included); a pinned block is a buffer as long as one storage holds it, since the host
// allocator hands it out again without tracing the free (a new storage at a known address is
// a new allocation, wherever it was made: the DataLoader's pin-memory thread too).
//
// Who writes: while a check hands its batches to the checker's raw sink, the program's threads
// only queue records of what they saw, and the recorder's own thread writes them, in order
// ("Deferred writing" below); Python's calls and checks without the raw sink write at once,
// after what is queued. A record of an op on pinned memory holds its storages until it is
// written; a program's thread lets go of them after that (hand_held, release_held).
//
// Locks, in the order they are taken: `mu` (the buffers, the batch), `raw_mu` (the hand-over),
// `q_mu` (the queue), `names_mu` (the streams' names); `rel_mu` (storages to let go of) is a
// leaf, taken under any of them. The allocator calls the tracker with its
// own lock held, so the tracker never takes the GIL; it takes `q_mu` (or `mu` when it writes at
// once). The op callbacks take the GIL (to find the user's frame) before any of them, never while
// holding one. Python reads the batch holding the GIL, then `mu`. The recorder's thread never
// touches Python.

#include <torch/extension.h>

#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <ATen/record_function.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/util/strides.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/SmallVector.h>
#include <frameobject.h>
#include <torch/version.h>

#include "pyframes.h"

// The GPU trace hook (events, waits, synchronizations) is written against the interpreter
// interface of the torch versions listed here (c10/core/impl/PyInterpreter.h's vtable and
// GPUTrace.h: the same in 2.11 and 2.12); elsewhere they come from Python's callbacks.
#if TORCH_VERSION_MAJOR == 2 && (TORCH_VERSION_MINOR == 11 || TORCH_VERSION_MINOR == 12)
#define STREAMSAN_GPU_TRACE 1
#include <torch/csrc/PyInterpreter.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <pthread.h>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------------------------
// JSON writing

// Writes pieces of an op's line into `out` through a pointer, room for at most `room` bytes made
// once: no call and no capacity check per piece (the op's line is most of a recorded op's
// writing). The string is cut to what was written when the writer goes.
class Put {
 public:
  Put(std::string& out, size_t room) : out_(out) {
    size_t start = out.size();
    out.resize(start + room);
    p_ = out.data() + start;
  }
  ~Put() { out_.resize(static_cast<size_t>(p_ - out_.data())); }
  Put(const Put&) = delete;
  Put& operator=(const Put&) = delete;

  template <size_t N>
  void lit(const char (&s)[N]) {
    std::memcpy(p_, s, N - 1);
    p_ += N - 1;
  }
  void str(const std::string& s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void ch(char c) { *p_++ = c; }
  void u64(uint64_t v) { p_ = std::to_chars(p_, p_ + 20, v).ptr; }
  void hex(uint64_t v) {
    lit("0x");
    p_ = std::to_chars(p_, p_ + 16, v, 16).ptr;
  }

 private:
  std::string& out_;
  char* p_;
};

void put_hex(std::string& out, uint64_t v) {
  Put w(out, 18);
  w.hex(v);
}

// A JSON string literal of `s`.
std::string jstr(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

// ---------------------------------------------------------------------------------------------
// Sites

// A quoted `"file:line"`, or `null`. Sites are interned (see `site_text`): a Site stays valid
// for the life of the process, so ops carry a pointer, not a copy.
using Site = const std::string*;
const std::string* const kNullSite = new std::string("null");

// ---------------------------------------------------------------------------------------------
// What is known about allocations

enum class Mem : uint8_t { Device, Pinned };

struct Buf {
  std::string name;  // quoted
  uint64_t size;
  Mem mem;
  // The storage that holds the block (pinned memory, and CPU storage standing for device memory
  // in tests): the host allocator hands a block out again without a trace of its free, so a
  // block is a new allocation when another storage holds it. Weak: the check never keeps a
  // program's memory alive.
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> owner;
  // Tests (fake device): the address the trace gave it (0: its own) and its stream (quoted).
  uint64_t written = 0;
  std::string stream;
};

// A live buffer starting at `addr` (see State::buf_slots).
struct BufSlot {
  uint64_t addr = 0;
  const Buf* buf = nullptr;
};
constexpr size_t kBufSlots = 1024;

size_t buf_slot(uint64_t addr) {
  return static_cast<size_t>(((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 54) & (kBufSlots - 1);
}

// Whether the live buffer `b` is still the storage `impl` (always, when it has no known owner).
bool same_storage(const Buf& b, const c10::StorageImpl* impl) {
  if (!b.owner || impl == nullptr) return true;
  return !b.owner->expired() && b.owner->_unsafe_get_target() == impl;
}

// (The small fields last: 64 bytes, one cache line, moved several times per op.)
struct Access {
  const Buf* buf = nullptr;  // null: an external buffer, named after `base` ("ext 0x…")
  uint64_t base = 0;         // the storage's data pointer
  uint64_t offset = 0;       // from the buffer's start
  uint64_t bytes = 0;
  uint64_t storage_bytes = 0;
  // The storage: compared by address only (device memory), or held (`hold`).
  c10::StorageImpl* impl = nullptr;
  // Host memory (pinned, and CPU storage standing for device memory in tests): the storage held
  // from when the region was seen until the op's end, where an unknown block is allocated from
  // it. An op may drop an input's storage while it runs (`set_` replaces its tensor's), and a
  // new allocation takes a reference to what it names.
  c10::intrusive_ptr<c10::StorageImpl> hold;
  bool write = false;
  bool device = true;  // device memory (else pinned host memory)
  c10::DeviceIndex device_index = 0;
};
static_assert(sizeof(Access) <= 64, "an Access fits a cache line");

// An op's regions, and the ones it writes: inline up to a few (most ops), on the heap past that.
using Accesses = c10::SmallVector<Access, 4>;
using AccessList = c10::SmallVectorImpl<Access>;
using Used = c10::SmallVector<Access*, 8>;
// A region written by an op a frame called: (base, offset, bytes, write).
using Covered = c10::SmallVector<std::tuple<uint64_t, uint64_t, uint64_t, bool>, 4>;

// How an op is treated.
enum class Kind : uint8_t {
  Normal,
  Skip,          // no memory access (metadata, factories, views)
  RecordStream,  // aten::record_stream
  Collective,    // c10d::*: runs on the process group's stream
  Composite,     // an aten op whose device work is all in the ops it calls (see op_info_slow)
  SetStorage,    // aten::set_: the tensor object only, unless the storage must grow (set_grows)
};

// What the recorder learns about an op by watching it run (see "Quiet callees"). Shared by every
// thread, relaxed atomics: each flag only ever goes one way, and a thread that reads one stale
// may quiet an op the moment after another thread learned it must not be.
struct Learned {
  // Ends seen with the ops it called observed, nothing met inside it that keeps them observed.
  std::atomic<uint32_t> seen_whole{0};
  // A host op (an event, a wait, a synchronization, a host access) or host memory was met inside
  // it: the ops it calls are always observed, so that each is written in its place among them.
  std::atomic<bool> keep_callees{false};
  // An op was seen beginning inside it (else there is nothing to quiet: RecordFunction stays on).
  std::atomic<bool> has_callees{false};
  Learned() = default;
  Learned(const Learned& o)
      : seen_whole(o.seen_whole.load()), keep_callees(o.keep_callees.load()), has_callees(o.has_callees.load()) {}
};

struct OpInfo {
  Kind kind = Kind::Normal;
  std::vector<uint8_t> arg_write;  // per schema argument
  bool fresh_returns = false;      // some return is not an alias of an argument
  bool copy = false;               // copy_ / _to_copy / to: non_blocking matters
  bool factory = false;            // empty*: allocates, touches nothing
  bool pins = false;               // _pin_memory: copies into fresh pinned memory
  // The host ops issued inside the op (after the last op it called) come before its own work:
  // ops outside aten (custom ops, whose implementations wait before they compute). An aten op's
  // own sync comes after its kernel (a host read: the copy, then the sync).
  bool syncs_first = false;
  // `*_like` and `new_*` ops take a tensor for its shape, dtype and device only: no read.
  bool meta_inputs = false;
  int non_blocking_arg = -1;
  // An aten op whose callees may go unobserved once it is learned to issue nothing but device
  // work on its own stream (see `quiet_callees`): not a copy, a factory, a collective, a custom op.
  bool may_quiet = false;
  mutable Learned learned;
  std::string name;  // quoted
};

struct Frame {
  const OpInfo* info = nullptr;
  bool active = false;
  Accesses accesses;  // the inputs' regions (from the start callback)
  // Accesses written by ops this one called: (base, offset, bytes, write).
  Covered covered;
  // Host ops issued inside this op since it began or since the last op it called began:
  // written before that op's work (issue order), or after this op's own work when it ends.
  std::vector<std::string> pending;
  std::string collective_stream;  // a collective's stream, once a wait named it (quoted)
  bool non_blocking = false;
  bool any_device = false;
  Site site = kNullSite;
  c10::DeviceIndex device = 0;
  uint64_t stream = 0;
  bool stream_set = false;  // `stream` is the op's (else found when a device output appears)
  bool not_float = false;   // an input tensor is not floating point (a mask, indices, counts)
  bool host_input = false;  // an input region is host memory
  // An input tensor has no strided storage of its own or reaches Python (sparse, a wrapper
  // subclass such as DTensor): what touches its parts is other ops.
  bool opaque_input = false;
  // May be quiet, learning aside (see may_be_quiet): a call that teaches `seen_whole`.
  bool eligible = false;
  int exceptions = 0;  // std::uncaught_exceptions() when it began
  // The ops it calls are not observed (RecordFunction off on this thread until it ends).
  bool quiet = false;
  // Quiet: the device blocks the allocator handed out inside it and did not take back yet: its
  // temporaries, written by the kernels of the ops it called.
  struct Temp {
    uint64_t addr, size, stream;
    c10::DeviceIndex device;
    // The whole block, written.
    Access written() const {
      Access a;
      a.base = addr;
      a.bytes = size;
      a.storage_bytes = size;
      a.write = true;
      a.device = true;
      a.device_index = device;
      return a;
    }
  };
  c10::SmallVector<Temp, 2> temps;

  // Back to a new frame's state, keeping what its lists hold on the heap for the next op.
  void reset() {
    info = nullptr;
    active = false;
    accesses.clear();
    covered.clear();
    pending.clear();
    collective_stream.clear();
    non_blocking = false;
    any_device = false;
    site = kNullSite;
    device = 0;
    stream = 0;
    stream_set = false;
    not_float = false;
    host_input = false;
    opaque_input = false;
    eligible = false;
    exceptions = 0;
    quiet = false;
    temps.clear();
  }
};

// A thread's frames, innermost last, each kept on the heap and used again by later ops (no
// frame of a few hundred bytes built per op). An op's end takes its frame off the stack whole
// (`Taken`) and works on it there: what the end meets on this thread (ops that begin and end,
// host ops issued while a storage it held is released) belongs to its caller, as once it has
// ended; the frame is reset off the stack, then kept for a later op.
class FrameStack {
 public:
  bool empty() const { return n_ == 0; }
  size_t size() const { return n_; }
  Frame& back() { return *frames_[n_ - 1]; }
  Frame& operator[](size_t i) { return *frames_[i]; }
  Frame& push() {
    if (n_ == frames_.size()) frames_.push_back(nullptr);
    std::unique_ptr<Frame>& slot = frames_[n_++];
    if (!slot) slot = std::make_unique<Frame>();  // a slot whose frame is taken, or a new one
    return *slot;
  }

  // The innermost frame, off the stack while it lives, then reset and kept (see FrameStack).
  class Taken {
   public:
    explicit Taken(FrameStack& s) : s_(s), f_(std::move(s.frames_[--s.n_])) {}
    ~Taken() {
      f_->reset();  // may release storages, whose release may run ops: the frame is not the stack's
      for (size_t i = s_.n_; i < s_.frames_.size(); i++) {
        if (!s_.frames_[i]) {
          s_.frames_[i] = std::move(f_);
          return;
        }
      }
    }
    Taken(const Taken&) = delete;
    Taken& operator=(const Taken&) = delete;
    Frame& operator*() { return *f_; }

   private:
    FrameStack& s_;
    std::unique_ptr<Frame> f_;
  };

 private:
  std::vector<std::unique_ptr<Frame>> frames_;
  size_t n_ = 0;
};

// What an op, a launch, an allocation, a free or a host op leaves to be written: the trace's
// lines are written from records, either at once (the program's thread, `mu` held) or later, in
// the order they were made, by the resolver (see "Deferred writing"). A record holds only what
// the program's thread saw when it happened; naming buffers and streams, finding the
// allocations regions fall in and the text are the writer's.
enum class RecKind : uint8_t {
  Op,      // a dispatcher op's launch, host accesses, record_stream (`info`)
  Launch,  // a kernel launched outside the dispatcher (Triton), named `text` (quoted)
  Alloc,   // an allocation of the caching allocator
  Free,    // its free
  Text,    // host ops, as finished lines (`text`)
  Host,    // a host op of c10's GPU trace issued outside ops (`host`), its line written later
  Temp,    // a temporary of a quiet op, written by the ops it called: a launch named for the op
  RecordStream,  // a device block marked used on a stream outside the dispatcher (`addr`, `stream`)
};

// The host ops c10's GPU trace reports (see traced_host_op).
// EventQuery, StreamQuery: a query that found the work complete (one that did not orders nothing).
enum class HostOp : uint8_t { EventRecord, EventWait, EventSync, StreamSync, DeviceSync, EventQuery, StreamQuery };

struct Rec {
  RecKind kind = RecKind::Text;
  Site site = kNullSite;
  const OpInfo* info = nullptr;  // Op
  uint64_t stream = 0;           // Op, Launch, Alloc: the raw handle
  c10::DeviceIndex device = 0;
  bool non_blocking = false;     // Op
  bool any_device = false;       // Op: some region is device memory (else a CPU op on pinned)
  bool outside_capture = false;  // Alloc: into a pool while no capture was recorded in progress
  HostOp host = HostOp::EventRecord;  // Host (with `addr` the event, `stream`, `device`)
  uint64_t addr = 0, size = 0;   // Alloc, Free
  std::pair<int64_t, int64_t> pool{0, 0};  // Alloc
  // Op, Launch: the regions, each once, less those the ops it called wrote (Op).
  c10::SmallVector<Access, 4> all;
  std::vector<Access> fresh;         // Op: outputs in fresh storage (pinned; the fake device)
  std::vector<std::string> pending;  // Op: the host ops it issued (its frame's `pending`)
  std::string text;  // Launch: the name; Text: the lines; Op: a collective's stream, once named
};

// A freed buffer's name is given to a new buffer only after this many other frees: reports of
// a run name distinct buffers, and the checker's table of names stays bounded.
constexpr size_t kNameDelay = 4096;
// Tests (fake device): where the addresses written for CPU storages standing for device memory
// begin (above any address a process maps, and any a test's fake allocator trace gives).
constexpr uint64_t kFakeAddrBase = uint64_t{1} << 56;

// Where values copied to the host land: managed memory, an address space the program's own
// (device and pinned) allocations never use.
const char* const kHostValues = "\"streamsan host values\"";
const char* const kHostValuesAlloc =
    "{\"op\":\"alloc\",\"buffer\":\"streamsan host values\",\"bytes\":8,\"memory\":\"managed\","
    "\"addr\":4096}\n";

struct PairHash {
  size_t operator()(const std::pair<PyObject*, int>& k) const noexcept {
    return std::hash<const void*>()(k.first) ^ (static_cast<size_t>(k.second) * 0x9E3779B97F4A7C15ull);
  }
};

// Time spent per stage of recording (nanoseconds), counted when profiling is on.
struct Profile {
  std::atomic<uint64_t> ops{0};        // ops written (launches, host accesses, record_stream)
  std::atomic<uint64_t> callbacks{0};  // RecordFunction callbacks (every op seen, written or not)
  std::atomic<uint64_t> regions{0};    // classify the op, its tensors' regions, their buffers
  std::atomic<uint64_t> site{0};       // the user's file:line from the Python stack
  std::atomic<uint64_t> serialize{0};  // the op's text
  std::atomic<uint64_t> allocator{0};  // the allocator's allocations and frees
  std::atomic<uint64_t> syncs{0};      // events, waits, synchronizations (site and text)
  std::atomic<uint64_t> handover{0};   // batches handed to the checker (Python's sink)
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> callback_total{0};  // everything inside the RecordFunction callbacks
  std::atomic<uint64_t> kernels{0};  // everything inside record_triton and record_kernel (Triton's launches)
  // The parts of `kernels`: the arguments' regions, the user's site, the record queued (and the
  // rest of record_launch: the enclosing op's covered regions, the name quoted)
  std::atomic<uint64_t> kernels_regions{0};
  std::atomic<uint64_t> kernels_site{0};
  std::atomic<uint64_t> kernels_submit{0};
  std::atomic<uint64_t> resolver{0};   // records written (resolved and turned into text), any thread
  std::atomic<uint64_t> resolved{0};   // records written from the queue
  std::atomic<uint64_t> deferred{0};   // records queued
  std::atomic<uint64_t> caught_up{0};  // times a program thread found the queue full and wrote it
  std::atomic<uint64_t> quieted{0};    // ops whose callees went unobserved
  // Ops recorded in full that wrote nothing of their own (their accesses written by the ops
  // they called, or none), by name; `mu` held.
  std::unordered_map<std::string, uint64_t> unwritten;
};

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Adds the time from its making to its end to `total` when the recorder's stages are timed.
struct StageTimer {
  std::atomic<uint64_t>& total;
  uint64_t t0;
  StageTimer(std::atomic<uint64_t>& total, bool on) : total(total), t0(on ? now_ns() : 0) {}
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  ~StageTimer() { stop(); }
  // Counts the time until now, once (the destructor then adds nothing).
  void stop() {
    if (t0 != 0) total += now_ns() - t0;
    t0 = 0;
  }
};

// Benchmarks only (bench_overhead.py ablate): parts of recording left out, to measure what each
// costs in place. A check with any of the first four on records a wrong trace; tests never set them.
enum Ablate : uint32_t {
  kAblateSite = 1,       // no user frame: the site is the latest one seen (no GIL taken)
  kAblateChecker = 2,    // batches are dropped, not handed to the checker
  kAblateAllocator = 4,  // the allocator's tracker returns at once
  kAblateWrite = 8,      // an op's regions are taken, nothing is resolved or written
  kSiteWithGil = 16,     // not left out: the user's frame always found under the GIL (as before)
  kResolverPaused = 32,  // not left out: the resolver's passes wait for a host synchronization
                         // (the program's threads write the queue when it is full: tests of the
                         // bound; tests of the synchronization's pass)
};
std::atomic<uint32_t> ablated{0};
bool ablating(Ablate what) { return (ablated.load(std::memory_order_relaxed) & what) != 0; }

// The checker's own entry point for batches (a capsule of the Rust extension's Checker,
// `_raw_sink()`): `push(ctx, data, len)` copies the JSON Lines into its queue, waiting only while
// the queue is full, and returns 0 (else the check is over: the batch is dropped). No Python, no
// GIL: any thread may call it. Version 2 adds `push_now`: the same, and the checker's thread is
// woken to check the batch at once (a system call, paid by the resolver's thread alone, where
// `push` leaves the batch to the thread's next look at its queue).
struct RawSink {
  uint32_t version;  // 1 or 2
  uintptr_t ctx;
  int32_t (*push)(uintptr_t ctx, const uint8_t* data, size_t len);
  int32_t (*push_now)(uintptr_t ctx, const uint8_t* data, size_t len);  // version 2
};
constexpr const char* kRawSinkName = "streamsan._streamsan.RawSink";

// What a check knew of the program's buffers, let go of when the next check starts. Hundreds of
// map nodes and up to kNameDelay spare names (and, for pinned memory and the fake device, a weak
// reference to each storage: a cache miss apiece) cost a program that enters a check a tenth of a
// millisecond; the resolver's thread frees them instead, with no lock held, while the check begins.
struct Leftovers {
  std::map<uint64_t, Buf> device_bufs, pinned_bufs;
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> fake_free;
  std::unordered_set<uint64_t> fake_pinned;
  std::map<std::pair<int64_t, int64_t>, std::string> pool_names;
  std::deque<std::string> spare_names[2];
  size_t size() const {
    return device_bufs.size() + pinned_bufs.size() + fake_free.size() + fake_pinned.size() +
           spare_names[0].size() + spare_names[1].size();
  }
};
// Fewer are freed where the check starts (handing them over wakes the resolver: a system call).
constexpr size_t kLeftoversApart = 256;

struct State {
  // What every callback reads, written only when a check starts or ends (the epochs: when
  // operators or code objects are forgotten; the captures: when a CUDA graph capture begins or
  // ends): a cache line of its own, which the threads that write records and hand batches over
  // never write to (a line they write to would be taken from the program's core at each of their
  // writes, and fetched back by its next callback).
  alignas(64) std::atomic<bool> active{false};
  std::atomic<bool> profiling{false};  // count each stage's time in `prof`
  std::atomic<bool> observe_only{false};  // callbacks return at once (profiling the floor)
  // The ops an op calls go unobserved once the op is learned to need nothing of them (see
  // "Quiet callees"; STREAMSAN_CALLEES=learn); false (the default): every op is observed.
  std::atomic<bool> quiet_callees{false};
  std::atomic<bool> defer{false};     // records are queued (a check with the raw sink runs)
  std::atomic<bool> defer_wanted{true};
  // Tests: ops on the fake device are deferred too. Not by default: a CPU storage standing for
  // device memory is freed when the recorder finds it gone, and a record written later finds
  // more gone than were when it was made (a free written before ops that came before it).
  std::atomic<bool> defer_fake{false};
  // Whether sites are found without the GIL (pyframes.h): where this CPython is one it reads,
  // and its walk agreed with the public API's at the latest check's start.
  std::atomic<bool> fast_frames{false};
  bool fake_device = false;  // tests: CPU tensors stand for device memory on `fake_stream`
  bool guard_spy = false;    // blocks marked used on a stream through c10's guard are seen
  void* pinned_deleter = nullptr;  // the host allocator's deleter: a storage that has it is pinned
  std::atomic<int> captures{0};  // CUDA graph captures in progress (set from Python)
  std::atomic<uint64_t> op_epoch{0};
  // Bumped whenever code_cache is emptied: each thread's caches of codes are then stale.
  std::atomic<uint64_t> code_epoch{1};
  alignas(64) std::mutex mu;
  // Records waiting to be written, in the order they were made (`q_mu` held; taken after `mu`,
  // or alone): see "Deferred writing".
  std::mutex q_mu;
  std::condition_variable q_cv;  // the resolver sleeps on it while nothing is deferred, and
                                 // between its passes
  // A host synchronization was issued (`q_mu` held, see kick_resolver): the resolver's next pass
  // hands everything written over, the checker's thread woken for it (`sync_pending`), and that
  // pass is to start now (`kicked`).
  bool sync_pending = false;
  bool kicked = false;
  std::atomic<uint64_t> last_pass_ns{0};  // when the resolver's latest pass began (now_ns)
  std::vector<Rec> queue;
  std::vector<Rec> resolving;  // the records being written (`mu` held): the queue's spare buffer
  // The host storages written records held (pinned memory), let go of by a program's thread
  // (release_held), never by the thread that wrote them: the last reference to a pinned block
  // frees it into the host allocator, which records events, which reach the GPU trace.
  // `rel_mu` held (a leaf: taken under any other lock, none taken under it).
  std::mutex rel_mu;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> held;
  std::atomic<size_t> n_held{0};
  // Records of ops on pinned memory written at once on the program's thread, with what is queued
  // before them (STREAMSAN_PINNED=at-once: how they were written before they were queued).
  std::atomic<bool> pinned_at_once{false};
  bool resolver_started = false;      // `q_mu` held
  bool resolver_asleep = false;       // waiting until woken (`q_mu` held): see kLingerNs
  std::vector<std::unique_ptr<Leftovers>> leftovers;  // for the resolver to free (`q_mu` held)
  // Leftovers handed to the resolver in this process, and those it has not freed yet.
  std::atomic<uint64_t> leftovers_handed{0}, leftovers_unfreed{0};
  std::atomic<uint64_t> resolver_errors{0};  // writes of queued records that failed (records lost)
  // Ops whose start callback threw (a tensor whose metadata could not be read): not recorded.
  std::atomic<uint64_t> callback_errors{0};
  std::mutex callback_error_mu;      // guards first_callback_error
  std::string first_callback_error;  // the first one's message (empty until one)
  // For tests of the guard above: the op named by STREAMSAN_TEST_UNREADABLE_OP (read when a
  // check begins) throws in its start callback after its frame is pushed, or in its end callback
  // with the suffix "@end", as an op whose arguments or outputs cannot be read would. Empty: off.
  std::array<char, 128> unreadable_op{};
  bool unreadable_at_end = false;
  // The streams' names (`names_mu` held, alone or after `mu`): read by the GPU trace's hooks,
  // which need no other state.
  std::mutex names_mu;
  // Held while a batch is handed to the raw sink, and to change it; taken after `mu` (never
  // `mu` while holding it), so that batches reach the checker in the order they were cut.
  std::mutex raw_mu;
  const RawSink* raw_sink = nullptr;  // `raw_mu` held
  py::object raw_sink_owner;          // the capsule (`raw_mu` and the GIL held)
  uint64_t raw_refused_bytes = 0;     // batches the raw sink refused (the check was over)
  std::string batch;  // JSON Lines not yet handed to Python
  // When the batch's oldest line was written, about (`mu` held): the resolver's pass after which
  // the batch was last found empty, or the latest hand-over (see kStaleBatchNs).
  uint64_t batch_since_ns = 0;
  std::string spare_batch;  // an empty buffer of a batch's size, for the next batch
  uint64_t fake_stream = 0;
  std::unordered_set<uint64_t> fake_pinned;  // tests: CPU storages standing for pinned memory
  uint64_t fake_next_addr = kFakeAddrBase;  // tests: the next address written for a CPU storage
  // Tests: written addresses freed, by stream (quoted) and size: given again on that stream only.
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> fake_free;
  size_t threshold = 1 << 18;
  py::object sink;  // called with the batch (bytes) when it passes the threshold
  uint64_t next_buf = 0;
  // Names of freed buffers, oldest first (device, pinned): reused once more than kNameDelay
  // were freed, so that a long run's checker keeps a bounded set of names.
  std::deque<std::string> spare_names[2];
  std::map<uint64_t, Buf> device_bufs;  // by address
  std::map<uint64_t, Buf> pinned_bufs;
  // The live buffers found last at their first byte, by address (device, pinned): most
  // tensors' storages start where their block does, and a tree's walk costs a cache miss a level.
  // A buffer's slot is emptied when it is freed.
  std::array<std::array<BufSlot, kBufSlots>, 2> buf_slots{};
  std::unordered_map<uint64_t, std::string> stream_names;  // raw handle -> quoted id (`names_mu`)
  std::unordered_map<const char*, OpInfo> ops;              // by the schema name's pointer
  // Records without an operator schema, by their text: their names are strings of their own,
  // made for each call (autograd's "autograd::engine::evaluate_function: AddmmBackward0"), whose
  // address a later, different name may take.
  std::unordered_map<std::string, OpInfo> labels;
  // Operators taken off the dispatcher: their names' memory may be reused by another operator's
  // name, so their kinds leave `ops` (kept here: an op in flight may point at its kind), and each
  // thread's caches by address are emptied when it sees `op_epoch` change.
  std::vector<std::unordered_map<const char*, OpInfo>::node_type> retired_ops;
  std::atomic<Site> last_site{kNullSite};                   // for threads without Python frames
  std::string torch_dir, own_dir, cwd;  // cwd ends in '/': sites under it are shown relative
  std::string stdlib_dir;               // Python's standard library (threading.py …): not the user's
  std::vector<std::string> libraries;   // site-packages folders inside stdlib_dir: not stdlib
  // Folders of code that is not the user's though outside torch: Triton's package, the files
  // Inductor generates (its cache).
  std::vector<std::string> internal_dirs;
  // Dynamo's map from the code it rewrote to the user's (torch._dynamo.utils.orig_code_map):
  // a rewritten frame calls the compiled code; the user's line is the frame that called it.
  py::object rewritten_codes;
  std::unordered_map<PyObject*, std::pair<bool, std::string>> code_cache;  // code -> (internal, shown file)
  // The site of a user line, by its code object (kept alive by code_cache) and instruction; the
  // text itself is interned in site_texts, never freed. GIL held for both.
  std::unordered_map<std::pair<PyObject*, int>, Site, PairHash> site_cache;
  std::unordered_set<std::string> site_texts;
  std::atomic<uint64_t> fast_sites{0}, slow_sites{0};  // ops' sites found without the GIL, with it
  uint64_t external_accesses = 0, bad_regions = 0;
  std::atomic<uint64_t> foreign_threads{0};  // ops of threads that run no Python
  // Allocations into a graph pool or a MemPool while no capture was recorded in progress
  // (torch.cuda.use_mem_pool, cudagraph trees' warm-up): written with the pool's name.
  uint64_t pool_allocations_outside_capture = 0;
  // Pool names by the allocator's id of the pool (quoted): those the graph recorder named (it
  // tells them here), and those first seen in an allocation, named "pool (A, B)" after the id.
  std::map<std::pair<int64_t, int64_t>, std::string> pool_names;
  uint64_t triton_launches = 0;  // kernel launches recorded through record_kernel
  std::vector<std::string> notices;
  bool tracker_attached = false;
  bool callback_added = false;
  bool host_values_allocated = false;  // the managed buffer values copied to the host land in
  at::CallbackHandle handle = 0;
  Profile prof;
};

State* S = new State();  // never destroyed: callbacks may outlive the module's teardown

// A direct-mapped cache in front of local_ops, by the op name's address: an op's lookup is one
// compare (a hash table's division and pointer chase cost more than the rest of a skipped op).
struct OpCacheSlot {
  const char* key = nullptr;
  const OpInfo* info = nullptr;
};
constexpr size_t kOpCacheSlots = 512;

// What each thread keeps, in one thread-local (one TLS lookup per callback, not one per
// variable).
struct ThreadState {
  FrameStack frames;
  // The site of the op running on this thread ("null" outside ops): the allocator's tracker
  // runs on the allocating thread and cannot take the GIL, so it takes the site from here.
  Site cur_site = kNullSite;
  // Op kinds already looked up by this thread (no lock): operators by their name's address,
  // labels (records without a schema) by their text.
  std::unordered_map<const char*, const OpInfo*> local_ops;
  std::unordered_map<std::string, const OpInfo*> local_labels;
  OpCacheSlot op_cache[kOpCacheSlots];
  // A direct-mapped cache in front of local_labels, by the label's text: a label's string is
  // made for each call (the autograd engine's "evaluate_function: …" around each backward node),
  // and finding it here takes neither a copy of the text nor a hash table's probe.
  struct LabelSlot {
    std::string text;
    const OpInfo* info = nullptr;
  };
  static constexpr size_t kLabelSlots = 128;
  LabelSlot label_slots[kLabelSlots];
  uint64_t op_epoch = 0;  // S->op_epoch when the caches by address were last valid
  // What this thread knows of code objects, to find its user's frame without the GIL: whether a
  // code is internal (not the user's), and the site of a user line by code and instruction.
  // Valid while `code_epoch` is S->code_epoch (the process-wide caches keep the codes alive).
  std::unordered_map<const void*, bool> internal_codes;
  std::unordered_map<std::pair<PyObject*, int>, Site, PairHash> sites;
  uint64_t code_epoch = 0;
  // Direct-mapped caches in front of those two (a frame's lookup is one compare): an op's walk
  // visits several frames (torch's modules, then the user's line).
  struct CodeSlot {
    const void* code = nullptr;
    bool internal = false;
  };
  struct SiteSlot {
    const void* code = nullptr;
    int lasti = -1;
    Site site = nullptr;
  };
  static constexpr size_t kCodeSlots = 256, kSiteSlots = 512;
  CodeSlot code_slots[kCodeSlots];
  SiteSlot site_slots[kSiteSlots];
};

size_t code_slot(const void* code) {
  return static_cast<size_t>((reinterpret_cast<uintptr_t>(code) >> 4) * 0x9E3779B97F4A7C15ull >> 56) &
         (ThreadState::kCodeSlots - 1);
}
size_t site_slot(const void* code, int lasti) {
  return static_cast<size_t>(((reinterpret_cast<uintptr_t>(code) >> 4) ^ (static_cast<uint64_t>(lasti) << 20)) *
                                 0x9E3779B97F4A7C15ull >> 55) &
         (ThreadState::kSiteSlots - 1);
}
// This thread's state, made at its first use. A plain pointer: a thread-local object with a
// constructor is reached through a call that checks it was made, at every use; this is one load.
// Deleted when the thread ends; a callback during the thread's end after that (a tensor freed by
// another thread-local's destructor) gets a new one, which is left to the process.
thread_local ThreadState* ts_ptr = nullptr;

struct ThreadStateOwner {
  ~ThreadStateOwner() {
    ThreadState* p = ts_ptr;
    ts_ptr = nullptr;
    delete p;
  }
};

C10_NOINLINE ThreadState& make_thread_state() {
  static thread_local ThreadStateOwner owner;  // its destructor deletes the state
  (void)owner;
  ts_ptr = new ThreadState();
  return *ts_ptr;
}

inline ThreadState& tls() {
  ThreadState* p = ts_ptr;
  return C10_LIKELY(p != nullptr) ? *p : make_thread_state();
}

// The quoted stream id of a raw handle (a name once given stays: the reference too).
const std::string& stream_name(uint64_t raw, c10::DeviceIndex device) {
  std::lock_guard<std::mutex> n(S->names_mu);
  auto it = S->stream_names.find(raw);
  if (it != S->stream_names.end()) return it->second;
  std::string name;
  if (raw == 0) {
    name = device == 0 ? "default" : "default@cuda:" + std::to_string(device);
  } else {
    std::string h;
    put_hex(h, raw);
    name = "stream " + h;
  }
  return S->stream_names.emplace(raw, jstr(name)).first->second;
}

std::array<BufSlot, kBufSlots>& slots_of(const std::map<uint64_t, Buf>& bufs) {
  return S->buf_slots[&bufs == &S->device_bufs ? 0 : 1];
}

// The live buffer containing [addr, addr + 1), or null; `mu` held.
const Buf* find_buf(std::map<uint64_t, Buf>& bufs, uint64_t addr, uint64_t* base) {
  BufSlot& slot = slots_of(bufs)[buf_slot(addr)];
  if (slot.buf != nullptr && slot.addr == addr) {
    *base = addr;
    return slot.buf;
  }
  auto it = bufs.upper_bound(addr);
  if (it == bufs.begin()) return nullptr;
  --it;
  if (addr >= it->first + std::max<uint64_t>(it->second.size, 1)) return nullptr;
  *base = it->first;
  if (it->first == addr) slot = BufSlot{addr, &it->second};
  return &it->second;
}

// ---------------------------------------------------------------------------------------------
// The user's file:line

bool internal_file(const std::string& f) {
  if (!S->torch_dir.empty() && f.compare(0, S->torch_dir.size(), S->torch_dir) == 0) return true;
  if (!S->own_dir.empty() && f.compare(0, S->own_dir.size(), S->own_dir) == 0) return true;
  if (!S->stdlib_dir.empty() && f.compare(0, S->stdlib_dir.size(), S->stdlib_dir) == 0) {
    for (const auto& lib : S->libraries) {
      if (f.compare(0, lib.size(), lib) == 0) return false;
    }
    return true;
  }
  for (const auto& dir : S->internal_dirs) {
    if (f.compare(0, dir.size(), dir) == 0) return true;
  }
  // FX's generated modules (`<eval_with_key>.N`), Python's frozen modules.
  return f.compare(0, 8, "<frozen ") == 0 || f.compare(0, 15, "<eval_with_key>") == 0;
}

// Whether `code` is a frame Dynamo rewrote (it calls the compiled code) or one of its resume
// functions; GIL held.
bool rewritten_by_dynamo(PyCodeObject* code) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_name");
  bool resume = false;
  if (name && PyUnicode_Check(name)) {
    const char* s = PyUnicode_AsUTF8(name);
    resume = s && std::strncmp(s, "torch_dynamo_resume_in_", 23) == 0;
  }
  Py_XDECREF(name);
  PyErr_Clear();
  if (resume) return true;
  if (!S->rewritten_codes || S->rewritten_codes.is_none()) {
    // Dynamo imported since: its map (a module not imported has rewritten nothing).
    PyObject* name = PyUnicode_FromString("torch._dynamo.utils");
    PyObject* mod = name ? PyImport_GetModule(name) : nullptr;
    Py_XDECREF(name);
    if (mod) {
      PyObject* map = PyObject_GetAttrString(mod, "orig_code_map");
      if (map) S->rewritten_codes = py::reinterpret_steal<py::object>(map);
      Py_DECREF(mod);
    }
    PyErr_Clear();
    if (!S->rewritten_codes || S->rewritten_codes.is_none()) return false;
  }
  int in = PySequence_Contains(S->rewritten_codes.ptr(), reinterpret_cast<PyObject*>(code));
  if (in < 0) PyErr_Clear();
  return in == 1;
}

// What code_cache knows of `code` (looked up on first sight: whether it is internal, the file
// shown); GIL held. The cache keeps the code alive: its address is the key.
const std::pair<bool, std::string>& code_info(PyCodeObject* code) {
  auto it = S->code_cache.find(reinterpret_cast<PyObject*>(code));
  if (it != S->code_cache.end()) return it->second;
  std::string file;
  PyObject* fn = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_filename");
  if (fn && PyUnicode_Check(fn)) {
    const char* s = PyUnicode_AsUTF8(fn);
    if (s) file = s;
  }
  Py_XDECREF(fn);
  PyErr_Clear();
  bool internal = internal_file(file) || rewritten_by_dynamo(code);
  std::string shown = file;
  if (!S->cwd.empty() && file.compare(0, S->cwd.size(), S->cwd) == 0) shown = file.substr(S->cwd.size());
  // The Python above may have let another thread put the same code in first: one reference each.
  auto [entry, inserted] =
      S->code_cache.emplace(reinterpret_cast<PyObject*>(code), std::make_pair(internal, shown));
  if (inserted) Py_INCREF(code);
  return entry->second;
}

// The interned site of a user line: `code` (kept alive by code_cache) at instruction offset
// `key` (its line number before Python 3.11), `shown` its file, `line` computes its line; GIL
// held. Cached by the instruction, which is cheaper to read than the line.
template <typename Line>
Site line_site(PyObject* code, int key, const std::string& shown, Line&& line) {
  auto k = std::make_pair(code, key);
  auto it = S->site_cache.find(k);
  if (it != S->site_cache.end()) return it->second;
  Site text = &*S->site_texts.insert(jstr(shown + ":" + std::to_string(line()))).first;
  S->site_cache.emplace(k, text);
  return text;
}

// The quoted `file:line` of the innermost frame outside torch and streamsan, through the public
// API (frame objects); GIL held.
Site user_site_api() {
  PyFrameObject* f = PyEval_GetFrame();
  if (!f) return kNullSite;
  Py_INCREF(f);
  Site site = kNullSite;
  for (int depth = 0; f && depth < 64; depth++) {
    PyCodeObject* code = PyFrame_GetCode(f);
    const auto& info = code_info(code);
    if (!info.first) {
#if PY_VERSION_HEX >= 0x030B0000
      const int key = PyFrame_GetLasti(f);
#else
      const int key = PyFrame_GetLineNumber(f);
#endif
      site = line_site(reinterpret_cast<PyObject*>(code), key, info.second,
                       [f] { return PyFrame_GetLineNumber(f); });
      Py_DECREF(code);
      Py_DECREF(f);
      return site;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return site;
}

// Empties this thread's caches of codes when code_cache was emptied since they were filled.
// Returns whether they were stale.
bool refresh_thread_codes(ThreadState& t) {
  const uint64_t epoch = S->code_epoch.load(std::memory_order_acquire);
  if (t.code_epoch == epoch) return false;
  t.internal_codes.clear();
  t.sites.clear();
  std::fill(std::begin(t.code_slots), std::end(t.code_slots), ThreadState::CodeSlot{});
  std::fill(std::begin(t.site_slots), std::end(t.site_slots), ThreadState::SiteSlot{});
  t.code_epoch = epoch;
  return true;
}

// The same, through the interpreter's frame records (pyframes.h), filling this thread's caches
// for site_without_gil; GIL held.
Site user_site_walk() {
  ThreadState& t = tls();
  refresh_thread_codes(t);
  PyThreadState* tstate = PyThreadState_Get();
  Site site = kNullSite;
  pyframes::walk(tstate, 64, [&](PyCodeObject* code, int lasti) {
    const auto& info = code_info(code);
    t.internal_codes.emplace(code, info.first);
    if (info.first) return false;
    site = line_site(reinterpret_cast<PyObject*>(code), lasti, info.second,
                     [code, lasti] { return PyCode_Addr2Line(code, lasti); });
    t.sites.emplace(std::make_pair(reinterpret_cast<PyObject*>(code), lasti), site);
    return true;
  });
  return site;
}

// The user's site on this thread (`tstate`, its own state) without the GIL, from what the
// thread's caches know; false when they miss a frame's code or line (then the GIL is needed).
bool site_without_gil(PyThreadState* tstate, Site* out, ThreadState& t) {
  if (refresh_thread_codes(t)) return false;
  bool missed = false;
  Site site = kNullSite;
  pyframes::walk(tstate, 64, [&](PyCodeObject* code, int lasti) {
    ThreadState::CodeSlot& cs = t.code_slots[code_slot(code)];
    if (cs.code != code) {
      auto c = t.internal_codes.find(code);
      if (c == t.internal_codes.end()) return missed = true;
      cs = ThreadState::CodeSlot{code, c->second};
    }
    if (cs.internal) return false;
    ThreadState::SiteSlot& ss = t.site_slots[site_slot(code, lasti)];
    if (ss.code != code || ss.lasti != lasti) {
      auto it = t.sites.find(std::make_pair(reinterpret_cast<PyObject*>(code), lasti));
      if (it == t.sites.end()) return missed = true;
      ss = ThreadState::SiteSlot{code, lasti, it->second};
    }
    site = ss.site;
    return true;
  });
  if (missed) return false;
  *out = site;
  return true;
}

// Whether sites are found through the frame records (this CPython has them, and they agreed
// with its public API at the check's start).
bool frames_without_gil() { return pyframes::kFastFrames && S->fast_frames.load(std::memory_order_relaxed); }

// The quoted `file:line` of the innermost frame outside torch and streamsan; GIL held.
Site user_site() { return frames_without_gil() ? user_site_walk() : user_site_api(); }

// Whether the frame walk without the GIL finds the same site as the public API here (the
// caller's stack); turns it on when it does, off when not (or where this CPython has none). GIL
// held.
bool check_frames() {
  bool agree = false;
  if (pyframes::kFastFrames) {
    Site api = user_site_api();
    Site walked = user_site_walk();
    PyThreadState* tstate = PyThreadState_Get();
    Site again = nullptr;
    agree = api == walked && site_without_gil(tstate, &again, tls()) && again == api;
  }
  S->fast_frames.store(agree);
  return agree;
}

// Adds one to a statistic that every recorded op counts (sites found with or without the GIL,
// ops of threads without Python): a load and a store, not a locked read-modify-write, which
// would wait for the op's earlier stores to drain; two threads counting at once may lose one.
inline void bump(std::atomic<uint64_t>& n) {
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// The site of an op on this thread: the user's frame when the thread runs Python, else the
// latest site seen (ops of the autograd engine's threads belong to the `backward()` that
// started them). The user's frame is found without the GIL where this thread has seen its
// frames' code before.
Site op_site(ThreadState& t) {
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) {
    bump(S->foreign_threads);
    return S->last_site.load(std::memory_order_relaxed);
  }
  if (ablating(kAblateSite)) return S->last_site.load(std::memory_order_relaxed);
  Site site = kNullSite;
  if (frames_without_gil() && !ablating(kSiteWithGil) && site_without_gil(tstate, &site, t)) {
    bump(S->fast_sites);
  } else {
    PyGILState_STATE st = PyGILState_Ensure();
    site = user_site();
    PyGILState_Release(st);
    bump(S->slow_sites);
  }
  if (site != kNullSite) {
    S->last_site.store(site, std::memory_order_relaxed);
    return site;
  }
  return S->last_site.load(std::memory_order_relaxed);
}

// The site of a host op (an event or a sync) issued on this thread: the user's frame, or none
// on a thread that runs no Python (what Python's callbacks of the GPU trace see). Any thread,
// GIL held or not.
Site host_site() {
  if (!Py_IsInitialized()) return kNullSite;
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) return kNullSite;
  Site site = kNullSite;
  // Without the GIL where this thread's caches know its frames, as for an op (op_site).
  if (frames_without_gil() && site_without_gil(tstate, &site, tls())) return site;
  PyGILState_STATE st = PyGILState_Ensure();
  site = user_site();
  PyGILState_Release(st);
  return site;
}

// ---------------------------------------------------------------------------------------------
// Regions of tensors

// The region of `t`'s view, or false when it touches no tracked memory.
bool region_of(const at::Tensor& t, bool write, Access& a) {
  if (!t.defined() || !t.has_storage()) return false;
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return false;  // a Python scalar
  const auto& st = t.storage();
  if (!st.data()) return false;
  // A nested tensor has no one shape (its sizes and strides throw): the whole of its buffer,
  // which holds all its components.
  const bool nested = t.unsafeGetTensorImpl()->is_nested();
  if (nested ? st.nbytes() == 0 : t.numel() == 0) return false;
  bool cuda = t.is_cuda();
  bool device = cuda;
  if (!cuda) {
    if (!t.is_cpu()) return false;
    if (S->fake_device) {
      device = S->fake_pinned.count(reinterpret_cast<uint64_t>(st.data())) == 0;
    } else {
      // Pinned memory: the host allocator's deleter.
      if (!S->pinned_deleter || st.data_ptr().get_deleter() != S->pinned_deleter) return false;
      device = false;
    }
  }
  uint64_t itemsize = t.element_size();
  uint64_t extent = 1;
  if (!nested) {
    auto sizes = t.sizes();
    auto strides = t.strides();
    for (size_t d = 0; d < sizes.size(); d++) {
      if (strides[d] < 0) return false;
      extent += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
    }
  }
  a.base = reinterpret_cast<uint64_t>(st.data());
  a.storage_bytes = st.nbytes();
  a.impl = st.unsafeGetStorageImpl();
  if (!cuda) a.hold = c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(a.impl);
  a.offset = nested ? 0 : static_cast<uint64_t>(t.storage_offset()) * itemsize;
  a.bytes = nested ? st.nbytes() : extent * itemsize;
  a.write = write;
  a.device = device;
  a.device_index = cuda ? t.device().index() : 0;
  return true;
}

void add_tensor(const at::Tensor& t, bool write, AccessList& out, Frame& fr) {
  if (t.defined() && !c10::isFloatingType(t.scalar_type()) && !c10::isComplexType(t.scalar_type()) &&
      !t.unsafeGetTensorImpl()->is_wrapped_number()) {
    fr.not_float = true;
  }
  if (t.defined() && (!t.has_storage() || t.layout() != c10::kStrided ||
                      t.key_set().has(c10::DispatchKey::Python))) {
    fr.opaque_input = true;
  }
  Access a;
  if (!region_of(t, write, a)) return;
  if (a.device) {
    if (!fr.any_device) fr.device = a.device_index;
    fr.any_device = true;
  } else {
    fr.host_input = true;
  }
  out.push_back(std::move(a));
}

// A list of tensors (`Tensor[]`, `Tensor?[]`) is a list of IValues like any other: no type
// comparison (IValue::isTensorList is out of line, and asked of every argument that is not a
// tensor, it cost 3% of the callbacks).
void add_ivalue(const c10::IValue& v, bool write, AccessList& out, Frame& fr) {
  if (v.isTensor()) {
    add_tensor(v.toTensor(), write, out, fr);
  } else if (v.isList()) {
    for (const c10::IValue& x : v.toListRef()) {
      if (x.isTensor()) add_tensor(x.toTensor(), write, out, fr);
    }
  } else if (v.isTuple()) {
    for (const c10::IValue& x : v.toTupleRef().elements()) add_ivalue(x, write, out, fr);
  }
}

// ---------------------------------------------------------------------------------------------
// Op classification (once per op)

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

const OpInfo& op_info_slow(const at::RecordFunction& fn, bool* by_address);


const OpInfo& op_info(const at::RecordFunction& fn, ThreadState& t) {
  const uint64_t epoch = S->op_epoch.load(std::memory_order_acquire);
  if (C10_UNLIKELY(t.op_epoch != epoch)) {
    // An operator was taken off the dispatcher: its name's address may now be another's.
    t.op_epoch = epoch;
    t.local_ops.clear();
    for (auto& slot : t.op_cache) slot = OpCacheSlot{};
  }
  const char* key = fn.name();
  OpCacheSlot& slot = t.op_cache[(reinterpret_cast<uintptr_t>(key) >> 3) & (kOpCacheSlots - 1)];
  if (slot.key == key && key != nullptr) return *slot.info;
  const OpInfo* info;
  auto it = t.local_ops.find(key);
  if (it != t.local_ops.end()) {
    info = it->second;
  } else {
    bool by_address = true;
    info = &op_info_slow(fn, &by_address);
    if (!by_address) return *info;  // a label's own string: never cached by its address
    t.local_ops.emplace(key, info);
  }
  slot.key = key;
  slot.info = info;
  return *info;
}

// Whether the op's device kernel (CUDA's; CPU's on the tests' fake device) is its
// CompositeImplicitAutograd kernel: no kernel of its own for the device, nor an explicit
// composite one.
bool composite_only(const at::RecordFunction& fn) {
  auto name = fn.operator_name();
  if (!name) return false;
  auto op = c10::Dispatcher::singleton().findOp(*name);
  if (!op) return false;
  using K = c10::DispatchKey;
  if (!op->hasKernelForDispatchKey(K::CompositeImplicitAutograd)) return false;
  for (K k : {K::CUDA, K::CPU, K::CompositeExplicitAutograd, K::CompositeExplicitAutogradNonFunctional}) {
    if (op->hasKernelForDispatchKey(k)) return false;
  }
  return true;
}

// This thread's slot in its cache of labels for `text`: by its length and its last sixteen
// bytes (labels of one kind share their beginning, "autograd::engine::evaluate_function: ", and
// differ at the end); the slot's text is compared whole.
ThreadState::LabelSlot& label_slot(ThreadState& t, std::string_view text) {
  uint64_t h = text.size() * 0x9E3779B97F4A7C15ull;
  const size_t n = text.size();
  for (size_t end = n, k = 0; k < 2 && end > 0; k++) {
    uint64_t w = 0;
    const size_t take = end < 8 ? end : 8;
    std::memcpy(&w, text.data() + end - take, take);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
    end -= take;
  }
  return t.label_slots[(h >> 57) & (ThreadState::kLabelSlots - 1)];
}

// Keeps `info` as the label `name`'s kind on this thread; returns it.
const OpInfo& known_label(ThreadState& t, const std::string& name, const OpInfo& info) {
  ThreadState::LabelSlot& slot = label_slot(t, name);
  slot.text = name;
  slot.info = &info;
  return info;
}

// `by_address` is set false for a record without an operator schema: it is looked up by its
// text (S->labels), and its address must not be kept as its key.
const OpInfo& op_info_slow(const at::RecordFunction& fn, bool* by_address) {
  const char* key = fn.name();
  // A record names an operator (its schema's name, alive as long as the operator) or is a label
  // with a string of its own (RecordFunction's `fn_`: a schema or a std::string).
  const bool label = !fn.operator_name().has_value();
  if (label) {
    *by_address = false;
    ThreadState& t = tls();
    const std::string_view text = key ? std::string_view(key) : std::string_view();
    const ThreadState::LabelSlot& slot = label_slot(t, text);
    if (slot.info != nullptr && slot.text == text) return *slot.info;
  }
  std::string name = key ? key : "";
  if (label) {
    ThreadState& t = tls();
    auto mine = t.local_labels.find(name);
    if (mine != t.local_labels.end()) return known_label(t, name, *mine->second);
    std::lock_guard<std::mutex> g(S->mu);
    auto it = S->labels.find(name);
    if (it != S->labels.end()) {
      t.local_labels.emplace(name, &it->second);
      return known_label(t, name, it->second);
    }
  } else {
    std::lock_guard<std::mutex> g(S->mu);
    auto it = S->ops.find(key);
    if (it != S->ops.end()) return it->second;
  }
  std::optional<c10::FunctionSchema> schema;
  if (!label) schema = fn.operator_schema();
  OpInfo info;
  info.name = jstr(name);
  static const char* skip[] = {
      "aten::size",     "aten::stride",      "aten::sym_size",
      "aten::sym_stride",   "aten::sym_numel",     "aten::sym_storage_offset",
      "aten::is_pinned",    "aten::is_same_size",  "aten::dim",         "aten::numel",
      "aten::is_contiguous", "aten::_version",     "aten::output_nr",   "aten::requires_grad_",
      "aten::retain_grad",  "aten::set_data",      "aten::data",        "aten::_is_zerotensor",
      "aten::is_conj",      "aten::is_neg",        "aten::result_type", "aten::can_cast",
      "aten::promote_types", "aten::detach",       "aten::alias",       "aten::lift_fresh",
      "aten::_unsafe_view", "aten::_reshape_alias", "aten::view",       "aten::resolve_conj",
      "aten::resolve_neg",  "aten::record_stream",
      // In place, but on the tensor object alone (its sizes, strides, storage): no memory is
      // read or written, though the schemas mark `self` written (`set_`: see Kind::SetStorage).
      "aten::as_strided_",   "aten::squeeze_",    "aten::unsqueeze_",
      "aten::t_",           "aten::transpose_",    "aten::swapaxes_",   "aten::swapdims_",
      "aten::detach_",      "aten::rename_",       "aten::_coalesced_",
  };
  info.pins = name == "aten::_pin_memory" || name == "aten::pin_memory";
  info.factory = starts_with(name, "aten::empty") || starts_with(name, "aten::new_empty");
  if (info.factory) {
    // Handled apart: allocation only.
  } else if (name == "aten::record_stream") {
    info.kind = Kind::RecordStream;
  } else if (starts_with(name, "c10d::")) {
    info.kind = Kind::Collective;
  } else if (name == "aten::set_") {
    info.kind = Kind::SetStorage;
  } else {
    for (const char* s : skip) {
      if (name == s) info.kind = Kind::Skip;
    }
  }
  if (schema) {
    bool all_alias = !schema->returns().empty();
    for (const auto& r : schema->returns()) {
      if (!r.alias_info()) {
        all_alias = false;
        info.fresh_returns = true;
      }
    }
    bool any_write = false;
    int i = 0;
    for (const auto& a : schema->arguments()) {
      bool w = a.alias_info() && a.alias_info()->isWrite();
      any_write |= w;
      info.arg_write.push_back(w ? 1 : 0);
      if (a.name() == "non_blocking") info.non_blocking_arg = i;
      i++;
    }
    // View ops: every return aliases an argument and nothing is written.
    if (info.kind == Kind::Normal && !info.factory && all_alias && !any_write) info.kind = Kind::Skip;
  }
  // A FUNCTION-scope record without an operator schema and without a namespace is not an
  // operator but a label around one (autograd's own "detach"): the operators it runs are recorded
  // themselves. Recorded as an op, it would read its inputs on the current stream before the
  // syncs issued inside it.
  if (!schema && name.find("::") == std::string::npos && info.kind == Kind::Normal &&
      !info.factory && !info.pins) {
    info.kind = Kind::Skip;
  }
  // An aten op whose device kernel is its CompositeImplicitAutograd one (aten::linear,
  // aten::cross_entropy_loss, …) does all its work through the ops it calls, which are recorded
  // themselves: it has nothing of its own to write, and its inputs and site are not looked at.
  // It keeps a frame: the host ops issued inside it are written when it ends, and what the ops
  // it called wrote is covered for its caller, as for any op that writes nothing of its own.
  if (info.kind == Kind::Normal && !info.factory && !info.pins && starts_with(name, "aten::") &&
      composite_only(fn)) {
    info.kind = Kind::Composite;
  }
  info.meta_inputs = starts_with(name, "aten::new_") ||
                     (starts_with(name, "aten::") && name.size() >= 5 &&
                      name.compare(name.size() - 5, 5, "_like") == 0);
  info.syncs_first = !starts_with(name, "aten::") && info.kind != Kind::Collective &&
                     info.kind != Kind::RecordStream;
  info.copy = name == "aten::copy_" || name == "aten::_to_copy" || name == "aten::to" ||
              starts_with(name, "aten::copy_") || starts_with(name, "aten::to.");
  info.may_quiet = info.kind == Kind::Normal && starts_with(name, "aten::") && !info.copy &&
                   !info.factory && !info.pins && !info.meta_inputs && info.non_blocking_arg < 0 &&
                   name.find("copy") == std::string::npos;
  std::lock_guard<std::mutex> g(S->mu);
  if (label) {
    const OpInfo& known = S->labels.emplace(name, std::move(info)).first->second;
    ThreadState& t = tls();
    t.local_labels.emplace(name, &known);
    return known_label(t, name, known);
  }
  return S->ops.emplace(key, std::move(info)).first->second;
}

// ---------------------------------------------------------------------------------------------
// Writing ops (`mu` held)

// The most bytes put_site writes for `site`.
size_t site_room(const std::string& site) { return site.size() + 12; }

// Ends an op's line: its site when there is one (an op may have none), the closing brace.
void put_site(Put& w, const std::string& site) {
  if (site != "null") {
    w.lit(",\"site\":");
    w.str(site);
  }
  w.lit("}\n");
}

void put_site(std::string& out, const std::string& site) {
  Put w(out, site_room(site));
  put_site(w, site);
}

// A `record_stream` op (names quoted).
void put_record_stream(std::string& out, const std::string& buf, const std::string& stream, const std::string& site) {
  out += "{\"op\":\"record_stream\",\"buffer\":";
  out += buf;
  out += ",\"stream\":";
  out += stream;
  put_site(out, site);
}

// The most bytes put_region writes for `a`.
size_t region_room(const Access& a) { return 72 + (a.buf ? a.buf->name.size() : 24); }

void put_region(Put& w, const Access& a) {
  w.lit("{\"buffer\":");
  if (a.buf) {
    w.str(a.buf->name);
  } else {
    w.lit("\"ext ");
    w.hex(a.base);
    w.ch('"');
  }
  w.lit(",\"offset\":");
  w.u64(a.offset);
  w.lit(",\"bytes\":");
  w.u64(a.bytes);
  w.ch('}');
}

void put_region(std::string& out, const Access& a) {
  Put w(out, region_room(a));
  put_region(w, a);
}

// Writes the free of a live buffer and forgets it; its name waits to be given again.
void free_buf(std::map<uint64_t, Buf>& bufs, std::map<uint64_t, Buf>::iterator it,
              const std::string& site) {
  {
    Put w(S->batch, 24 + it->second.name.size() + site_room(site));
    w.lit("{\"op\":\"free\",\"buffer\":");
    w.str(it->second.name);
    put_site(w, site);
  }
  S->spare_names[it->second.mem == Mem::Device ? 0 : 1].push_back(std::move(it->second.name));
  if (it->second.written != 0) {
    S->fake_free[{std::move(it->second.stream), it->second.size}].push_back(it->second.written);
  }
  BufSlot& slot = slots_of(bufs)[buf_slot(it->first)];
  if (slot.buf == &it->second) slot = BufSlot{};
  bufs.erase(it);
}

// A name for a new buffer: a fresh one, or one freed more than kNameDelay frees ago.
std::string new_name(Mem mem) {
  auto& spare = S->spare_names[mem == Mem::Device ? 0 : 1];
  if (spare.size() > kNameDelay) {
    std::string name = std::move(spare.front());
    spare.pop_front();
    return name;
  }
  return jstr((mem == Mem::Device ? "d" : "h") + std::to_string(++S->next_buf));
}

// Tests (fake device): CPU storages standing for device memory whose storage is gone are freed
// now. The CPU allocator traces no free; without this, a buffer stays known (and its storage's
// object alive) until its address is handed out again, which a long run's heap may never do.
void sweep_fake_device(const std::string& site) {
  for (auto it = S->device_bufs.begin(); it != S->device_bufs.end();) {
    auto next = std::next(it);
    if (it->second.owner && it->second.owner->expired()) free_buf(S->device_bufs, it, site);
    it = next;
  }
}

// Tests (fake device): the address written for a CPU storage standing for device memory of
// `size` bytes on `stream` (its own address stays the recorder's key). The CPU allocator hands an
// address freed on one stream to another stream at once, where the caching allocator gives a
// block back to the stream that allocated it, and to another stream only through the driver
// (which synchronizes the device: the spec's rule for device memory seen again on another
// stream). So an address freed is written again for the same size on the same stream only, as
// the caching allocator reuses its blocks; `mu` held.
uint64_t fake_addr(const std::string& stream, uint64_t size) {
  auto it = S->fake_free.find({stream, size});
  if (it != S->fake_free.end() && !it->second.empty()) {
    uint64_t a = it->second.back();
    it->second.pop_back();
    return a;
  }
  uint64_t a = S->fake_next_addr;
  S->fake_next_addr += (std::max<uint64_t>(size, 1) + 511) / 512 * 512;
  return a;
}

void new_alloc(uint64_t addr, uint64_t size, Mem mem, const std::string& stream,
               const std::string& site, c10::StorageImpl* impl = nullptr,
               const std::string* pool = nullptr) {
  auto& bufs = mem == Mem::Device ? S->device_bufs : S->pinned_bufs;
  if (mem == Mem::Device && S->fake_device && impl != nullptr) sweep_fake_device(site);
  // Memory handed out again: what still overlaps it was freed (pinned memory's frees are not
  // traced; they are inferred here). One walk of the tree a buffer: the one before `addr` when
  // it reaches `addr`, else the first after it when it starts before `addr + size`.
  std::map<uint64_t, Buf>::iterator next;
  for (;;) {
    next = bufs.upper_bound(addr);
    auto old = bufs.end();
    if (next != bufs.begin()) {
      auto prev = std::prev(next);
      if (addr < prev->first + std::max<uint64_t>(prev->second.size, 1)) old = prev;
    }
    if (old == bufs.end() && next != bufs.end() && next->first < addr + size) old = next;
    if (old == bufs.end()) break;
    free_buf(bufs, old, site);
  }
  Buf b;
  b.name = new_name(mem);
  b.size = size;
  b.mem = mem;
  if (impl != nullptr && (mem == Mem::Pinned || S->fake_device)) {
    // The storage is alive (its op is running): a weak reference to it from a new strong one.
    b.owner.emplace(c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(impl));
  }
  if (mem == Mem::Device && S->fake_device && impl != nullptr) {
    b.written = fake_addr(stream, size);
    b.stream = stream;
  }
  {
    Put w(S->batch, 120 + b.name.size() + stream.size() + (pool ? pool->size() : 0) + site_room(site));
    w.lit("{\"op\":\"alloc\",\"buffer\":");
    w.str(b.name);
    w.lit(",\"bytes\":");
    w.u64(size);
    if (mem == Mem::Device) {
      w.lit(",\"stream\":");
      w.str(stream);
      if (pool) {
        w.lit(",\"pool\":");
        w.str(*pool);
      }
    } else {
      w.lit(",\"memory\":\"pinned\"");
    }
    w.lit(",\"addr\":");
    w.u64(b.written != 0 ? b.written : addr);
    put_site(w, site);
  }
  bufs.emplace_hint(next, addr, std::move(b));
}

// Resolves an access's buffer; false when it cannot be written (a region past its allocation).
// Pinned memory that no known buffer holds (a block the host allocator handed out again to
// another storage, memory pinned on a thread or before the check where no op of it was seen) is
// allocated here, at its first use (`site`).
bool resolve(Access& a, const std::string& site, const std::string* stream = nullptr) {
  uint64_t base = 0;
  auto& bufs = a.device ? S->device_bufs : S->pinned_bufs;
  const Buf* b = find_buf(bufs, a.base, &base);
  if (!a.device && a.impl != nullptr && (!b || base != a.base || !same_storage(*b, a.impl))) {
    new_alloc(a.base, a.storage_bytes, Mem::Pinned, "null", site, a.impl);
    b = find_buf(bufs, a.base, &base);
  } else if (a.device && S->fake_device && stream != nullptr && a.impl != nullptr &&
             (!b || (base == a.base && !same_storage(*b, a.impl)))) {
    // Tests (fake device): a CPU storage standing for device memory that no op was seen making
    // (the CPU allocator traces nothing), or at the address of a known buffer whose storage is
    // gone, is allocated at its first use, on that use's stream.
    new_alloc(a.base, a.storage_bytes, Mem::Device, *stream, site, a.impl);
    b = find_buf(bufs, a.base, &base);
  }
  if (b) {
    a.buf = b;
    a.offset += a.base - base;
    if (a.offset + a.bytes > b->size) {
      S->bad_regions++;
      if (a.offset >= b->size) return false;
      a.bytes = b->size - a.offset;
    }
    return true;
  }
  if (!a.device) return false;
  // Device memory allocated before the check began: an external buffer of the trace.
  S->external_accesses++;
  return true;
}

// Whether the batch is to be handed over: it is large enough, or (`whole`) holds anything;
// `mu` held.
bool batch_full(bool whole = false) {
  return !S->batch.empty() && (whole || S->batch.size() >= S->threshold);
}

// Takes the batch out when it is to be handed over (batch_full; the next one goes into the buffer
// the previous one was handed over from: no growing a new one by doubling each time); `mu` held.
bool cut_batch(std::string& out, bool whole = false) {
  if (!batch_full(whole)) return false;
  out.swap(S->batch);
  S->batch.swap(S->spare_batch);
  return true;
}

// Keeps an emptied batch buffer for the next batch; `mu` held.
void keep_buffer_locked(std::string& out) {
  out.clear();
  if (S->spare_batch.capacity() < out.capacity()) S->spare_batch.swap(out);
}

// The same, `mu` not held.
void keep_buffer(std::string& out) {
  std::lock_guard<std::mutex> g(S->mu);
  keep_buffer_locked(out);
}

// Counts a hand-over that began at `t0` (profiling on).
void count_handover(uint64_t t0) {
  S->prof.handover += now_ns() - t0;
  S->prof.batches++;
}

// Hands `out` to the checker's raw sink `raw` (it may wait while the checker's queue is full);
// `raw_mu` held. `now`: the checker's thread is woken to check it at once (the resolver's
// hand-overs while the program waits), where the sink can.
void push_raw(const RawSink* raw, const std::string& out, bool now = false) {
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  auto push = now && raw->version >= 2 ? raw->push_now : raw->push;
  int32_t rc = push(raw->ctx, reinterpret_cast<const uint8_t*>(out.data()), out.size());
  if (profiling) count_handover(t0);
  if (rc != 0) S->raw_refused_bytes += out.size();
}

// Hands the batch to Python when it is large enough; GIL held, `mu` not held.
void maybe_flush() {
  std::string out;
  py::object sink;
  {
    std::lock_guard<std::mutex> g(S->mu);
    if (!S->sink || !cut_batch(out)) return;
    sink = S->sink;
  }
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  try {
    sink(py::bytes(out));
    if (profiling) count_handover(t0);
  } catch (py::error_already_set& e) {
    // The sink reports its own errors; never let one escape into the op.
    e.restore();
    PyErr_Clear();
  }
  keep_buffer(out);
}

// Hands the batch over when it is large enough, `mu` not held: to the checker's raw sink where it
// gave one (from any thread, GIL or not), else to Python's sink (GIL taken, on a thread that runs
// Python; elsewhere the batch waits for the next hand-over).
void flush_batch() {
  std::string out;
  {
    std::unique_lock<std::mutex> g(S->mu);
    if (!batch_full()) return;
    std::unique_lock<std::mutex> r(S->raw_mu);
    if (S->raw_sink != nullptr && ablating(kAblateChecker)) {
      S->batch.clear();
      return;
    }
    if (S->raw_sink != nullptr) {
      cut_batch(out);
      g.unlock();
      push_raw(S->raw_sink, out);
      r.unlock();
      keep_buffer(out);
      return;
    }
  }
  if (PyGILState_GetThisThreadState() == nullptr || !Py_IsInitialized()) return;
  PyGILState_STATE st = PyGILState_Ensure();
  maybe_flush();
  PyGILState_Release(st);
}

void set_deferring(bool on);

// Lets go of the check's Python sink once the check has ended, so that nothing of a finished
// check is kept alive here (the recorder's sink holds its Run: the report, and the temporary copy
// of its ops the report removes when it goes). GIL held; the sink is released with `mu` not held
// (releasing it may run Python).
void release_sink() {
  py::object old;
  {
    std::lock_guard<std::mutex> g(S->mu);
    old = std::exchange(S->sink, py::object());
  }
}

// The checker's raw sink (a capsule), or None: batches go to Python's sink. GIL held. False when
// `capsule` is not one (the Python sink stays).
bool set_raw_sink(py::object capsule) {
  const RawSink* raw = nullptr;
  if (!capsule.is_none()) {
    void* p = PyCapsule_GetPointer(capsule.ptr(), kRawSinkName);
    if (p == nullptr) {
      PyErr_Clear();
      return false;
    }
    raw = static_cast<const RawSink*>(p);
    if (raw->version != 1 && raw->version != 2) return false;
  }
  py::object old;
  {
    std::lock_guard<std::mutex> r(S->raw_mu);
    S->raw_sink = raw;
    old = std::move(S->raw_sink_owner);
    S->raw_sink_owner = raw ? capsule : py::object();
  }
  // Records are deferred while the raw sink takes the batches (the resolver hands them over
  // without Python); once it is gone, written at once (what is queued: by `drain`).
  set_deferring(raw != nullptr && S->defer_wanted.load());
  return true;  // `old` released here, no lock held
}

// Whether a check with the raw sink defers its records to the resolver (the default), or writes
// them on the program's threads (benchmarks: STREAMSAN_DEFER=0).
void set_defer(bool on, bool fake_device) {
  S->defer_wanted.store(on);
  S->defer_fake.store(fake_device);
}

// ---------------------------------------------------------------------------------------------
// The RecordFunction callbacks

// The raw handle of the stream current on this thread for `device`.
uint64_t current_stream(c10::DeviceIndex device) {
  if (S->fake_device) return S->fake_stream;
  return reinterpret_cast<uint64_t>(c10::cuda::getCurrentCUDAStream(device).stream());
}

// The stream a collective runs on: the one named by the first wait among its host ops
// `pending` that is not its own current stream `own` (PyTorch makes the process group's stream
// wait for the current one before the collective), quoted; empty when none. Sets `*split` past
// that wait.
std::string collective_stream_of(const std::vector<std::string>& pending, const std::string& own,
                                 size_t* split) {
  static const std::string prefix = "{\"op\":\"event_wait\",\"stream\":";
  for (size_t i = 0; i < pending.size(); i++) {
    const std::string& w = pending[i];
    if (w.rfind(prefix, 0) != 0) continue;
    size_t start = prefix.size();
    size_t end = w.find(",\"event\"", start);
    if (end == std::string::npos) continue;
    std::string s = w.substr(start, end - start);
    if (s == own) continue;
    if (split) *split = i + 1;
    return s;
  }
  return std::string();
}

// ---------------------------------------------------------------------------------------------
// Deferred writing
//
// While a check hands its batches to the checker's raw sink, the program's threads do not write
// the trace: an op's end callback, a Triton launch, the allocator's tracker and the host ops
// outside ops each queue a record of what they saw (`push`: one short lock, no map, no text),
// and the resolver, a thread of the recorder's own, writes the queued records every half
// millisecond, in the order they were queued: it finds the allocation each region falls in,
// names buffers and streams, writes the lines, and hands the batch over. Whatever writes under
// `mu` (`StateLock`) first writes what is queued, so the trace keeps each thread's order
// whoever writes it: what is written at once (Python's calls) comes after every record queued
// before it. The queue is
// bounded: a thread that finds it full writes it itself, the only time the program waits for
// the resolver. `drain()` writes what is left when the check ends.

// The most records queued: a thread that queues the last one writes them all.
constexpr size_t kMaxQueued = 4096;

void write_rec(Rec& r);

// Hands the batch to the checker's raw sink when it passes the threshold (or, `whole`, whatever
// it holds); `mu` held (batches leave in the order they were written), `raw_mu` taken. The push
// may wait while the checker's queue is full: the program is held back, as at any hand-over.
// `now`: the checker's thread is woken for it (see push_raw). False when there is no raw sink.
bool hand_over_locked(bool whole, bool now = false) {
  if (!batch_full(whole)) return true;
  std::lock_guard<std::mutex> r(S->raw_mu);
  if (S->raw_sink == nullptr) return false;
  if (ablating(kAblateChecker)) {
    S->batch.clear();
    return true;
  }
  std::string out;
  cut_batch(out, whole);
  S->batch_since_ns = now_ns();  // what is left of the batch (if anything) came after it
  push_raw(S->raw_sink, out, now);
  keep_buffer_locked(out);
  return true;
}

// The host storages `r` holds, handed to `S->held` for a program's thread to let go of (see
// release_held); `r` holds none after. Never throws: a storage that cannot be handed over (out
// of memory) is leaked, not freed here.
void hand_hold(Access& a) noexcept {
  if (!a.hold) return;
  try {
    std::lock_guard<std::mutex> g(S->rel_mu);
    S->held.push_back(std::move(a.hold));
    S->n_held.store(S->held.size(), std::memory_order_relaxed);
  } catch (...) {
    (void)a.hold.release();  // leaked: freeing it here could reach the GPU trace
  }
}

void hand_held(Rec& r) noexcept {
  for (Access& a : r.all) hand_hold(a);
  for (Access& a : r.fresh) hand_hold(a);
}

// Lets go of the host storages written records held: on a program's thread, holding none of
// the recorder's locks, outside the allocator's tracker and the GPU trace's hooks (a freed
// pinned block's events reach the GPU trace, as when the program drops a pinned tensor), at the
// start of an op, after a record, at a check's end; not while a CUDA graph capture is in
// progress (then at its end), where the program let go of none. A check that ends during a
// capture it saw begin keeps them until the next check opens (open_check); a check opened
// during a capture begun before it does not know of that capture.
void release_held() {
  if (S->n_held.load(std::memory_order_relaxed) == 0 || S->captures.load(std::memory_order_relaxed) != 0) return;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> out;
  {
    std::lock_guard<std::mutex> g(S->rel_mu);
    out.swap(S->held);
    S->n_held.store(0, std::memory_order_relaxed);
  }
}

// Writes every queued record; `mu` held. The records are released here, `mu` held, the host
// storages they hold handed to a program's thread first (hand_held). `hand_over`: each
// batch goes to the raw sink as soon as it is full (the resolver's thread, and the end of a
// check: the checker checks the first batches while the last are written), never inside the
// allocator's tracker or an op's callback. Returns how many records there were.
size_t resolve_queued(bool hand_over = false) {
  std::vector<Rec>& work = S->resolving;
  {
    std::lock_guard<std::mutex> q(S->q_mu);
    if (S->queue.empty()) return 0;
    work.swap(S->queue);
  }
  const size_t n = work.size();
  struct Clear {
    std::vector<Rec>& w;
    ~Clear() {
      for (Rec& r : w) hand_held(r);
      w.clear();
    }
  } clear{work};
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  try {
    for (Rec& r : work) {
      write_rec(r);
      if (hand_over && batch_full()) hand_over_locked(false);
    }
  } catch (...) {
    // Out of memory writing a line: the rest of these records are lost, and the check says so
    // (`resolver_errors`: the trace is incomplete) rather than failing the op that wrote them.
    S->resolver_errors.fetch_add(1);
  }
  if (profiling) {
    S->prof.resolver += now_ns() - t0;
    S->prof.resolved += n;
  }
  return n;
}

// `mu`, taken once what is queued is written: what is written under it comes after that.
struct StateLock {
  std::unique_lock<std::mutex> g;
  StateLock() : g(S->mu) { resolve_queued(); }
};

// After a record was queued (`n` are queued now).
void queued(size_t n, bool may_flush) {
  if (S->profiling.load(std::memory_order_relaxed)) S->prof.deferred++;
  if (n >= kMaxQueued) {
    // The resolver is behind: this thread writes the queue itself, and hands the batch over
    // where it may (waiting, as the resolver would, while the checker's queue is full: the
    // program is held back, memory stays bounded); the allocator's tracker leaves it to the
    // resolver or the next op.
    S->prof.caught_up++;
    bool flush;
    {
      StateLock g;
      flush = S->batch.size() >= S->threshold;
    }
    if (flush && may_flush) flush_batch();
  }
}

// The record `fill` makes: queued while records are deferred, built in its slot of the queue (a
// record is a few hundred bytes: not moved), unless `now` (it must be written at once); else
// written at once, and the batch handed over when large enough where `may_flush` (never in the
// allocator's tracker, which must not take the GIL). `fill` takes no lock; a record it leaves
// unfinished (an exception: out of memory) is not queued.
template <class Fill>
void submit(bool now, bool may_flush, Fill&& fill) {
  if (!now && S->defer.load(std::memory_order_relaxed)) {
    size_t n;
    {
      std::lock_guard<std::mutex> q(S->q_mu);
      Rec& slot = S->queue.emplace_back();
      try {
        fill(slot);
      } catch (...) {
        hand_held(slot);  // (its release could reach the GPU trace: not under q_mu)
        S->queue.pop_back();  // no record rather than half of one
        throw;
      }
      n = S->queue.size();
    }
    queued(n, may_flush);
    return;
  }
  Rec r;  // released after every lock: the storages its regions hold may free pinned memory
  fill(r);
  bool flush;
  {
    StateLock g;
    write_rec(r);
    flush = S->batch.size() >= S->threshold;
  }
  if (flush && may_flush) flush_batch();
}

// Host ops, as finished lines, in their place among the records.
void emit_text(std::string&& text, bool may_flush) {
  submit(false, may_flush, [&](Rec& r) { r.text = std::move(text); });  // a Text record
}

// The same, from a frame's list of them (emptied).
void emit_lines(std::vector<std::string>& lines, bool may_flush) {
  if (lines.empty()) return;
  std::string text;
  for (auto& p : lines) text += p;
  lines.clear();
  emit_text(std::move(text), may_flush);
}

// The longest a part batch waits on the resolver's thread while the program keeps issuing ops:
// then it goes to the checker, which checks it while the program runs. A batch fills (16 KiB,
// about 55 ops) faster than this in most programs; a decode loop of a few dozen ops a millisecond
// without a host synchronization would otherwise leave up to a batch to be checked at the
// check's end, while the program waits.
constexpr uint64_t kStaleBatchNs = 1'000'000;

// How long the resolver keeps looking every half millisecond after a check ends, before it sleeps
// until woken: a check begun meanwhile (a program that checks every step, a test's loop of
// checks) is found at its next look, and the program's thread pays no wake-up of it (a system
// call, 10-30 µs where CPUs are virtual) when the check starts.
constexpr uint64_t kLingerNs = 200'000'000;

// The resolver's thread: while records are deferred, writes the queue every half millisecond
// and hands the batch over when it is large enough, or whatever it holds once a look finds
// nothing new queued (the program is waiting: for the GPU, a lock, its input) or it has waited
// kStaleBatchNs: the checker checks it meanwhile, and what is left for the check's end is the
// little issued since; else sleeps until a check defers again. After a host synchronization
// (kick_resolver) the next pass hands over everything written, and that pass starts at once
// unless one began less than kKickGapNs before or nothing was queued since: the program is
// about to wait for the GPU, and the checker checks what came before the synchronization during
// that wait.
void resolver_main() {
  for (;;) {
    bool synced;
    {
      std::vector<std::unique_ptr<Leftovers>> gone;
      {
        std::unique_lock<std::mutex> q(S->q_mu);
        const auto wanted = [] { return S->defer.load() || !S->leftovers.empty(); };
        for (const uint64_t until = now_ns() + kLingerNs; !wanted() && now_ns() < until;) {
          S->q_cv.wait_for(q, std::chrono::microseconds(500));
        }
        if (!wanted()) {
          S->resolver_asleep = true;
          S->q_cv.wait(q, wanted);
          S->resolver_asleep = false;
        }
        gone.swap(S->leftovers);
      }
      if (!gone.empty()) {
        const size_t n = gone.size();
        gone.clear();  // freed here, no lock held (storages' references among them)
        S->leftovers_unfreed.fetch_sub(n);
        continue;
      }
    }
    {
      std::unique_lock<std::mutex> q(S->q_mu);
      // Deferring ended since the look above: back to waiting for it, or for leftovers.
      if (!S->defer.load()) continue;
      S->q_cv.wait_for(q, std::chrono::microseconds(500), [] { return S->kicked; });
      const bool kicked = std::exchange(S->kicked, false);
      if (ablating(kResolverPaused) && !kicked) continue;
      synced = std::exchange(S->sync_pending, false);
    }
    const uint64_t pass = now_ns();
    S->last_pass_ns.store(pass, std::memory_order_relaxed);
    try {
      // Full batches go over as they fill (resolve_queued), what is left once nothing new came,
      // a synchronization asked for it, or it has waited kStaleBatchNs (a program that issues
      // ops more slowly than a batch fills and never pauses for a whole pass: a decode loop
      // between host synchronizations); the checker's thread is woken for the latter two (it
      // finds the others at its next look, within a millisecond: a program between ops pays no
      // wake-up of it every half millisecond).
      std::lock_guard<std::mutex> g(S->mu);
      const bool idle = resolve_queued(true) == 0;
      // (batch_since_ns may be later than the pass's start: a hand-over in this pass set it)
      const bool stale = !S->batch.empty() && pass >= S->batch_since_ns + kStaleBatchNs;
      if (idle || synced || stale) hand_over_locked(true, synced || stale);
      if (S->batch.empty()) S->batch_since_ns = pass;
    } catch (...) {
      // Out of memory handing the batch over (resolve_queued counts its own failures): counted
      // (`resolver_errors`: the trace is incomplete) rather than ending the process.
      S->resolver_errors.fetch_add(1);
    }
  }
}

// Fork: the child gets every lock free and no resolver (its threads are not copied); it writes
// at once until a check of its own starts one. The parent's check is not the child's: the child
// records nothing of it, what it had queued and not handed over is dropped there, and its raw
// sink (the checker's queue, whose thread is not in the child) is let go of. `raw_mu` may be
// held across a hand-over that waits for the checker: it is not waited for, but made anew in
// the child.
void before_fork() {
  S->mu.lock();
  S->q_mu.lock();
  S->names_mu.lock();
}
void after_fork_parent() {
  S->names_mu.unlock();
  S->q_mu.unlock();
  S->mu.unlock();
}
void after_fork_child() {
  // The parent's check is not the child's: the child records nothing of it (Run.__exit__ ends
  // it there without a report).
  S->active.store(false);
  S->defer.store(false);
  S->resolver_started = false;
  S->resolver_asleep = false;
  S->kicked = S->sync_pending = false;
  new (&S->q_cv) std::condition_variable();  // the parent's waiter is not in this process
  new (&S->raw_mu) std::mutex();
  S->raw_sink = nullptr;
  S->raw_sink_owner.release();  // the capsule's reference stays (no Python here)
  // The queued records hold storages (pinned ones among them: their release may call into the
  // host allocator, whose lock a parent thread may have held at the fork): not released here,
  // under the recorder's locks, but left to the child's memory.
  new (&S->queue) std::vector<Rec>();
  new (&S->resolving) std::vector<Rec>();
  new (&S->rel_mu) std::mutex();
  new (&S->held) std::vector<c10::intrusive_ptr<c10::StorageImpl>>();  // (left, as the queue is)
  S->n_held.store(0);
  new (&S->leftovers) std::vector<std::unique_ptr<Leftovers>>();
  S->leftovers_unfreed.store(0);
  S->batch.clear();
  after_fork_parent();
}

// The handlers above, once per process, from the first check on.
void watch_forks() {
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] { pthread_atfork(before_fork, after_fork_parent, after_fork_child); });
}

// Records are deferred from now on (`on`: a check with the raw sink starts; the resolver is
// started the first time), or written at once (the check ends: `drain` writes what is queued).
void set_deferring(bool on) {
  watch_forks();
  bool wake = false;
  {
    std::lock_guard<std::mutex> q(S->q_mu);
    // A synchronization of an earlier check asks nothing of this one.
    if (on) S->kicked = S->sync_pending = false;
    if (on && !S->resolver_started) {
      try {
        std::thread(resolver_main).detach();
        S->resolver_started = true;
      } catch (const std::system_error&) {
        on = false;  // no thread to be had: written at once
      }
    }
    S->defer.store(on);
    // A resolver still looking since the last check's end (kLingerNs) finds it by itself.
    wake = on && S->resolver_asleep;
  }
  // Woken with the lock let go of (woken while it is held, the resolver would only wait again,
  // for the lock).
  if (wake) S->q_cv.notify_all();
}

// Takes the host ops issued inside `fr` so far (its op is calling another op, or the allocator
// is allocating or freeing for it: what comes after them) into `out`. A collective keeps the
// stream its wait named, and keeps what it issued after that wait for after its own launch: the
// process group launches its kernel right after the wait that hands the work to its stream, then
// records the events that stand for the kernel's end (the work's end event, its future's).
// Written here, before the launch the collective's end writes, a stream waiting on such an event
// would be ordered before the kernel instead of after it.
void take_pending(Frame& fr, std::string& out) {
  if (fr.info && fr.info->kind == Kind::Collective) {
    size_t split = 0;  // what was issued before the wait (none once the wait was written)
    if (fr.collective_stream.empty()) {
      split = fr.pending.size();
      size_t past_wait = 0;
      fr.collective_stream =
          collective_stream_of(fr.pending, stream_name(fr.stream, fr.device), &past_wait);
      if (!fr.collective_stream.empty()) split = past_wait;
    }
    for (size_t i = 0; i < split; i++) out += fr.pending[i];
    fr.pending.erase(fr.pending.begin(), fr.pending.begin() + static_cast<std::ptrdiff_t>(split));
    return;
  }
  for (auto& p : fr.pending) out += p;
  fr.pending.clear();
}

// Writes (or queues) the host ops issued inside `fr` so far (take_pending).
void flush_pending(Frame& fr, bool may_flush = true) {
  std::string text;
  take_pending(fr, text);
  if (!text.empty()) emit_text(std::move(text), may_flush);
}

std::unique_ptr<at::ObserverContext> on_start_impl(const at::RecordFunction& fn, ThreadState& t);
void on_end_impl(const at::RecordFunction& fn, at::ObserverContext* ctx);

// ---------------------------------------------------------------------------------------------
// Quiet callees (STREAMSAN_CALLEES=learn; off by default)
//
// Many ops the dispatcher runs are called by other ops (the kernels of a composite, the ops of an
// optimizer's `_foreach_` kernels on the CPU), each callback paid for twice (PyTorch boxes the
// op's arguments for the observer, the observer looks at them). An op recorded in full already
// writes every region of its arguments, so what its callees add is little: the temporaries they
// allocate, use and free inside it (which a later holder of their bytes may race with:
// `reuse-race`), and the host ops they issue between their kernels (a synchronization inside
// `aten::index` with a mask: each must be written in its place). When asked for, an op is quiet
// (RecordFunction off on its thread until it ends, so none of its callees is observed) once it is
// learned to need neither:
// - it is an aten op recorded in full, not a copy, a factory or a collective, whose inputs are
//   plain strided tensors in device memory, all floating point (no masks, indices or counts:
//   the ops whose output shape depends on the data, and which synchronize to learn it);
// - nothing on the thread runs code of its own inside it or listens to its callees: autocast (it
//   keeps casts of an op's arguments for later calls), a dispatch mode, saved-tensor hooks (an
//   offloading pack hook copies on a stream of its own), a thread-local observer;
// - it was seen calling other ops, a call as eligible as this one was observed whole to its end,
//   and no host op (an event, a wait, a synchronization, a host access, as the GPU trace and the
//   hooks report them), no host memory, no callee that pins memory, is a collective, a custom op
//   or a record_stream, and no temporary on another stream was met inside it then or since.
// Its temporaries are then written as the op writing them (`RecKind::Temp`, on the block's
// stream): when the allocator takes one back inside the op, before its free, and when the op
// ends, those it did not take back (a workspace kept for later calls), with the op's own regions.
// What is learned holds for the process. Not exact: a host op first met inside a quiet call
// (learned from then on) is written with the op's pending host ops, before its single launch;
// a global observer other than this one does not see a quiet op's callees.

// The ops of the `n` outermost frames of this thread met something that needs their callees
// observed (see above).
void keep_callees(ThreadState& t, size_t n) {
  for (size_t i = 0; i < n && i < t.frames.size(); i++) {
    const OpInfo* info = t.frames[i].info;
    if (info != nullptr && !info->learned.keep_callees.load(std::memory_order_relaxed)) {
      info->learned.keep_callees.store(true, std::memory_order_relaxed);
    }
  }
}

// Whether the op of the innermost frame `fr` (its regions and stream known, its site found) could
// be quiet, what was learned of it aside: an aten op with device inputs alone, all floating point
// and plain tensors, and nothing on the thread that runs code of its own inside it (autocast and
// its kept casts, a dispatch mode, saved-tensor hooks) or listens to its callees (a thread-local
// observer).
bool quiet_eligible(const Frame& fr) {
  return fr.info->may_quiet && fr.any_device && !fr.not_float && !fr.host_input && !fr.opaque_input &&
         at::isRecordFunctionEnabled() && !at::hasThreadLocalCallbacks() &&
         !at::autocast::is_autocast_enabled(at::kCUDA) && !at::autocast::is_autocast_enabled(at::kCPU) &&
         c10::impl::TorchDispatchModeTLS::stack_len() == 0 &&
         at::SavedTensorDefaultHooks::get_tls_state().stack.empty();
}

// Whether the eligible op of `fr` is quiet now: quiet callees asked for, and learned to need
// nothing of its callees.
bool may_be_quiet(const Frame& fr) {
  const OpInfo& info = *fr.info;
  return S->quiet_callees.load(std::memory_order_relaxed) &&
         info.learned.has_callees.load(std::memory_order_relaxed) &&
         info.learned.seen_whole.load(std::memory_order_relaxed) > 0 &&
         !info.learned.keep_callees.load(std::memory_order_relaxed);
}

// A temporary of the quiet op of `fr`, written by its callees: a launch on the block's stream,
// named for the op, writing the whole block.
void write_temp(const Frame& fr, const Frame::Temp& temp, bool may_flush) {
  submit(false, may_flush, [&](Rec& r) {
    r.site = fr.site;
    r.stream = temp.stream;
    r.device = temp.device;
    r.text = fr.info->name;
    r.all.push_back(temp.written());
    r.kind = RecKind::Temp;
  });
}

// The test knob's op (see `unreadable_op`) throws as an unreadable one would, in its start
// callback or (`at_end`) its end callback, as the knob says.
void maybe_unreadable(const at::RecordFunction& fn, bool at_end) {
  if (at_end == S->unreadable_at_end && std::strcmp(fn.name(), S->unreadable_op.data()) == 0) {
    throw std::runtime_error("declared unreadable by STREAMSAN_TEST_UNREADABLE_OP");
  }
}

// Reads STREAMSAN_TEST_UNREADABLE_OP when a check begins, before it is active. Written only when
// it changes: the callbacks of a previous check's threads may still read it.
void read_unreadable_knob() {
  std::array<char, 128> op{};
  bool at_end = false;
  if (const char* v = std::getenv("STREAMSAN_TEST_UNREADABLE_OP")) {
    std::string_view name(v);
    if (name.size() > 4 && name.substr(name.size() - 4) == "@end") {
      at_end = true;
      name.remove_suffix(4);
    }
    if (name.size() < op.size()) std::memcpy(op.data(), name.data(), name.size());
  }
  if (op != S->unreadable_op) S->unreadable_op = op;
  if (at_end != S->unreadable_at_end) S->unreadable_at_end = at_end;
}

// An op a callback could not record (counted; the first one's message kept for the warning).
void unread_op(const at::RecordFunction& fn, const std::exception& e) noexcept {
  S->callback_errors.fetch_add(1, std::memory_order_relaxed);
  try {
    std::lock_guard<std::mutex> g(S->callback_error_mu);
    if (!S->first_callback_error.empty()) return;
    S->first_callback_error = std::string(fn.name()) + ": " + e.what();
    const size_t nl = S->first_callback_error.find('\n');
    if (nl != std::string::npos) S->first_callback_error.resize(nl);
  } catch (...) {  // out of memory: the count alone
  }
}

// An op whose start threw (what its arguments are could not be read): its frame, if pushed, is
// taken off again, and the op goes unrecorded (counted; the check's end warns). Nothing is
// raised into the program: PyTorch would log it and go on, with this thread's frames off by one.
std::unique_ptr<at::ObserverContext> on_start_guarded(const at::RecordFunction& fn) {
  ThreadState& t = tls();
  const size_t depth = t.frames.size();
  try {
    return on_start_impl(fn, t);
  } catch (const std::exception& e) {
    while (t.frames.size() > depth) {
      FrameStack::Taken taken(t.frames);
    }
    unread_op(fn, e);
    return nullptr;
  }
}

// The callbacks, their time counted whole when profiling.
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!S->profiling.load(std::memory_order_relaxed)) return on_start_guarded(fn);
  uint64_t t0 = now_ns();
  auto r = on_start_guarded(fn);
  S->prof.callback_total += now_ns() - t0;
  return r;
}

// An op whose end threw (its outputs could not be read): its frame is off the stack already
// (on_end_impl takes it first), and the op goes unrecorded (counted, as a start's).
void on_end_guarded(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  try {
    on_end_impl(fn, ctx);
  } catch (const std::exception& e) {
    unread_op(fn, e);
  }
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!S->profiling.load(std::memory_order_relaxed)) return on_end_guarded(fn, ctx);
  uint64_t t0 = now_ns();
  on_end_guarded(fn, ctx);
  S->prof.callback_total += now_ns() - t0;
}

// What on_start returns for an op it gave a frame: the end callback pops it. Ops without one
// (skipped ops, ops while no check records) pass straight through, and the host ops issued
// inside them belong to the enclosing op's frame, as if it had issued them.
// Kept for reuse on the thread that frees them (one start and end a recorded op): no heap
// allocation per op once a thread has as many as it nests.
struct Pushed final : at::ObserverContext {
  static void* operator new(size_t size);
  static void operator delete(void* p, size_t size);
};

// Trivially destructible (a Pushed freed during the thread's exit finds it intact); what it holds
// when its thread ends is left to the process (a few bytes per thread).
struct PushedPool {
  static constexpr int kMax = 64;
  void* free[kMax] = {};
  int n = 0;
};
thread_local PushedPool pushed_pool;

void* Pushed::operator new(size_t size) {
  PushedPool& pool = pushed_pool;
  if (size == sizeof(Pushed) && pool.n > 0) return pool.free[--pool.n];
  return ::operator new(size);
}

void Pushed::operator delete(void* p, size_t size) {
  PushedPool& pool = pushed_pool;
  if (size == sizeof(Pushed) && pool.n < PushedPool::kMax) {
    pool.free[pool.n++] = p;
    return;
  }
  ::operator delete(p);
}

// Whether an `aten::set_` call (its inputs: self, then the source storage or tensor, the
// storage offset, the sizes and the strides) needs more bytes than the source storage holds.
// Then PyTorch grows the storage (a new block, the old bytes copied on the current stream, the
// old block freed), and the call is recorded as any op is; else it changes the tensor object
// alone and is not recorded. An argument of another shape (symbolic sizes) counts as growing.
bool set_grows(const at::RecordFunction& fn) {
  auto in = fn.inputs();
  if (in.size() < 4) return false;  // set_(), set_(storage), set_(tensor): the source's own extent
  c10::StorageImpl* st = nullptr;
  if (in[1].isStorage()) {
    st = in[1].toStorage().unsafeGetStorageImpl();
  } else if (in[1].isTensor() && in[1].toTensor().has_storage()) {
    st = in[1].toTensor().storage().unsafeGetStorageImpl();
  }
  if (st == nullptr || !in[0].isTensor() || !in[2].isInt() || !in[3].isIntList()) return true;
  const int64_t offset = in[2].toInt();
  const std::vector<int64_t> sizes = in[3].toIntVector();
  std::vector<int64_t> given;
  if (in.size() > 4 && in[4].isIntList()) given = in[4].toIntVector();
  if (!given.empty() && given.size() != sizes.size()) return true;
  const c10::DimVector strides =
      given.empty() ? c10::contiguous_strides(sizes) : c10::DimVector(given.begin(), given.end());
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); d++) {
    if (sizes[d] == 0) return false;  // an empty view needs nothing
    if (sizes[d] < 0 || strides[d] < 0) return true;
    last += (sizes[d] - 1) * strides[d];
  }
  const uint64_t need = static_cast<uint64_t>(last + 1) * in[0].toTensor().element_size();
  return need > st->nbytes();
}

// `t`: this thread's state (one TLS lookup for the whole callback, in on_start_guarded).
std::unique_ptr<at::ObserverContext> on_start_impl(const at::RecordFunction& fn, ThreadState& t) {
  release_held();  // the host storages of records written since (see hand_held)
  // The order of one thread's ops is the order it issued them: what an enclosing op (or a label
  // around one: an autograd node, a hook) issued before this op began is written before it.
  if (!t.frames.empty() && !t.frames.back().pending.empty()) flush_pending(t.frames.back());
  if (!S->active.load(std::memory_order_relaxed) || S->observe_only.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  if (profiling) S->prof.callbacks++;
  const OpInfo& info = op_info(fn, t);
  if (!t.frames.empty()) {
    // An op inside another: that one has callees to quiet (see "Quiet callees"), unless this one
    // pins memory, is a collective, a custom op or a record_stream: then the ops around it keep
    // their callees observed (a copy to or from host memory does too: see its start, below).
    const OpInfo* caller = t.frames.back().info;
    if (caller != nullptr && !caller->learned.has_callees.load(std::memory_order_relaxed)) {
      caller->learned.has_callees.store(true, std::memory_order_relaxed);
    }
    if (info.pins || (info.syncs_first && info.kind != Kind::Skip) || info.kind == Kind::Collective ||
        info.kind == Kind::RecordStream) {
      keep_callees(t, t.frames.size());
    }
  }
  if (info.kind == Kind::Skip) return nullptr;
  if (info.kind == Kind::SetStorage && !set_grows(fn)) return nullptr;
  std::unique_ptr<at::ObserverContext> pushed = std::make_unique<Pushed>();
  Frame& fr = t.frames.push();
  fr.info = &info;
  if (info.kind == Kind::Composite) {
    fr.site = t.cur_site;
    return pushed;
  }
  if (S->unreadable_op[0] != '\0') [[unlikely]] maybe_unreadable(fn, /*at_end=*/false);
  auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size() && !info.meta_inputs; i++) {
    bool w = i < info.arg_write.size() && info.arg_write[i];
    if (info.kind == Kind::RecordStream) w = false;
    add_ivalue(inputs[i], w, fr.accesses, fr);
    if (static_cast<int>(i) == info.non_blocking_arg && inputs[i].isBool()) {
      fr.non_blocking = inputs[i].toBool();
    }
  }
  if (info.kind == Kind::RecordStream) {
    if (inputs.size() >= 2 && inputs[1].isStream()) {
      c10::Stream s = inputs[1].toStream();
      if (s.device_type() == c10::DeviceType::CUDA) {
        fr.stream = reinterpret_cast<uint64_t>(
            c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream());
        fr.device = s.device_index();
      }
    }
    fr.stream_set = true;
  } else if (fr.any_device) {
    fr.stream = current_stream(fr.device);
    fr.stream_set = true;
  } else if (info.factory) {
    // A factory's output decides: pinned memory (found at the end) or device memory (traced).
    if (S->fake_device) {
      fr.stream = S->fake_stream;
      fr.stream_set = true;
    }
  } else if (fr.accesses.empty() && !(S->fake_device && info.fresh_returns) && !info.pins) {
    return pushed;
  }
  fr.active = true;
  // Host memory inside the ops that called it: theirs keep their callees observed.
  if (fr.host_input) keep_callees(t, t.frames.size() - 1);
  // The user's frame, for this op and for what the allocator does inside it.
  // Finding the site may run Python (a code seen for the first time), and Python may run ops of
  // its own on this thread, which push and pop frames: `fr` is not used across it.
  Site site;
  if (profiling) {
    uint64_t t1 = now_ns();
    S->prof.regions += t1 - t0;
    site = op_site(t);
    S->prof.site += now_ns() - t1;
  } else {
    site = op_site(t);
  }
  Frame& me = t.frames.back();
  me.site = site;
  t.cur_site = site;
  // Whether it could be quiet: asked while quiet callees are (may_be_quiet), or while a call as
  // eligible as this one is yet to be seen whole (learned even while they are not: see
  // on_end_impl); else not asked (a dozen thread-local reads of PyTorch's).
  if (info.may_quiet && (S->quiet_callees.load(std::memory_order_relaxed) ||
                         info.learned.seen_whole.load(std::memory_order_relaxed) == 0)) {
    me.eligible = quiet_eligible(me);
    me.exceptions = std::uncaught_exceptions();
  }
  if (me.eligible && may_be_quiet(me)) {
    at::enableRecordFunction(false);  // back on when it ends (on_end_impl)
    me.quiet = true;
    S->prof.quieted.fetch_add(1, std::memory_order_relaxed);
  }
  return pushed;
}

bool is_covered(const Frame& fr, const Access& a) {
  for (const auto& c : fr.covered) {
    if (std::get<0>(c) == a.base && std::get<1>(c) == a.offset && std::get<2>(c) == a.bytes &&
        (std::get<3>(c) || !a.write))
      return true;
  }
  return false;
}

// The regions of `v` that `write` (or read), as `key` and a list; nothing when there are none.
template <size_t N>
void put_regions(Put& w, const char (&key)[N], const Used& v, bool write) {
  bool first = true;
  for (Access* a : v) {
    if (a->write != write) continue;
    if (first) {
      w.lit(key);
      w.ch('[');
    } else {
      w.ch(',');
    }
    first = false;
    put_region(w, *a);
  }
  if (!first) w.ch(']');
}

// Adds `a` to `all` unless its region is there already (then that one is written when either
// writes): each region of an op once.
void merge_region(AccessList& all, Access&& a) {
  for (Access& b : all) {
    if (b.base == a.base && b.offset == a.offset && b.bytes == a.bytes && b.device == a.device) {
      b.write = b.write || a.write;
      return;
    }
  }
  all.push_back(std::move(a));
}

// A kernel's `launch` on `stream` (quoted), named `name` (quoted), with its regions.
void put_launch(std::string& out, const std::string& stream, const std::string& name,
                const Used& used, const std::string& site) {
  size_t room = 64 + stream.size() + name.size() + site_room(site);
  for (const Access* a : used) room += region_room(*a) + 1;
  Put w(out, room);
  w.lit("{\"op\":\"launch\",\"stream\":");
  w.str(stream);
  w.lit(",\"name\":");
  w.str(name);
  put_regions(w, ",\"reads\":", used, false);
  put_regions(w, ",\"writes\":", used, true);
  put_site(w, site);
}

// Host ops of a frame that ends without writing anything of its own go to its parent, or out.
void pass_pending(Frame& fr, Frame* parent) {
  if (fr.pending.empty()) return;
  if (parent) {
    for (auto& p : fr.pending) parent->pending.push_back(std::move(p));
    return;
  }
  emit_lines(fr.pending, true);
}

// The quoted name of the pool with the allocator's id `id`; `mu` held.
const std::string& pool_name_of(std::pair<int64_t, int64_t> id) {
  auto it = S->pool_names.find(id);
  if (it != S->pool_names.end()) return it->second;
  std::string name = "pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
  return S->pool_names.emplace(id, jstr(name)).first->second;
}

// Whether a record of the regions `v` is written at once rather than queued: it is of the fake
// device (see State::defer_fake). A record that holds pinned memory is queued like any other:
// the storages it holds are handed back to a program's thread once it is written (hand_held).
bool written_at_once(const AccessList& v) {
  if (S->fake_device && !S->defer_fake.load(std::memory_order_relaxed)) return true;
  return S->pinned_at_once.load(std::memory_order_relaxed) &&
         std::any_of(v.begin(), v.end(), [](const Access& a) { return !a.device; });
}

// Writes a dispatcher op's record (see on_end_impl); `mu` held.
void write_op(Rec& r) {
  const OpInfo& info = *r.info;
  const std::string& site = *r.site;
  std::string& out = S->batch;
  const std::string& own_stream = stream_name(r.stream, r.device);
  // Fresh pinned storage (and, in tests, CPU storage standing for device memory) is a new
  // allocation; device allocations come from the allocator's tracker.
  for (Access& o : r.fresh) {
    auto& bufs = o.device ? S->device_bufs : S->pinned_bufs;
    auto known = bufs.find(o.base);
    // The same storage seen again, or (pinned) a block handed out again to a new storage.
    if (known != bufs.end() && same_storage(known->second, o.impl)) continue;
    new_alloc(o.base, o.storage_bytes, o.device ? Mem::Device : Mem::Pinned, own_stream, site, o.impl);
  }
  if (info.factory) {
    for (auto& p : r.pending) out += p;
    return;
  }
  if (info.kind == Kind::RecordStream) {
    for (Access& a : r.all) {
      if (!resolve(a, site, &own_stream) || !a.buf) continue;
      put_record_stream(out, a.buf->name, own_stream, site);
    }
    for (auto& p : r.pending) out += p;
    return;
  }
  Used used;
  bool any_host = false;
  for (Access& a : r.all) {
    if (!resolve(a, site, &own_stream)) continue;
    any_host |= !a.device;
    used.push_back(&a);
  }
  if (used.empty() && S->profiling.load(std::memory_order_relaxed)) S->prof.unwritten[info.name]++;
  // A collective runs on the process group's stream: after the wait that hands the work to
  // that stream, which it names (written already when the collective called another op).
  size_t split = 0;
  const std::string* stream_ptr = &own_stream;
  std::string collective;  // the stream a collective's wait named
  if (info.kind == Kind::Collective) {
    if (!r.text.empty()) {
      stream_ptr = &r.text;
    } else {
      collective = collective_stream_of(r.pending, own_stream, &split);
      if (!collective.empty()) stream_ptr = &collective;
    }
    for (size_t i = 0; i < split; i++) out += r.pending[i];
  }
  const std::string& stream_id = *stream_ptr;
  bool host_value = false;
  if (info.syncs_first) {
    for (size_t i = split; i < r.pending.size(); i++) out += r.pending[i];
    split = r.pending.size();
  }
  if (!used.empty() && r.any_device) {
    // Work on a stream: kernels, and copies to and from pinned memory.
    put_launch(out, stream_id, info.name, used, site);
    // A value the host takes from device memory and waits for (`.item()`, `.cpu()`,
    // `print(t)`): a copy into host memory, the synchronization, and the host's read of
    // what was copied — the sync is what makes the value there, needed by construction.
    bool writes = false;
    for (Access* a : used) writes |= a->write;
    for (size_t i = split; i < r.pending.size() && !writes; i++) {
      const std::string& p = r.pending[i];
      host_value |= p.rfind("{\"op\":\"stream_sync\"", 0) == 0 ||
                    p.rfind("{\"op\":\"device_sync\"", 0) == 0 ||
                    p.rfind("{\"op\":\"event_sync\"", 0) == 0;
    }
    if (host_value) {
      if (!S->host_values_allocated) {
        S->host_values_allocated = true;
        out += kHostValuesAlloc;
      }
      out += "{\"op\":\"launch\",\"stream\":";
      out += stream_id;
      out += ",\"name\":";
      out += info.name;
      out += ",\"writes\":[";
      out += kHostValues;
      out += "]";
      put_site(out, site);
    }
    if (any_host && info.copy && r.non_blocking) {
      // PyTorch's host allocator records an event for the copy: the pinned block is not
      // handed out again before the copy is done.
      for (Access* a : used) {
        if (a->device || !a->buf) continue;
        put_record_stream(out, a->buf->name, stream_id, site);
      }
    }
  } else {
    // A CPU op on pinned memory: the host reads or writes it.
    for (Access* a : used) {
      out += a->write ? "{\"op\":\"host_write\",\"buffer\":" : "{\"op\":\"host_read\",\"buffer\":";
      put_region(out, *a);
      put_site(out, site);
    }
  }
  for (size_t i = split; i < r.pending.size(); i++) out += r.pending[i];
  if (host_value) {
    out += "{\"op\":\"host_read\",\"buffer\":";
    out += kHostValues;
    put_site(out, site);
  }
}

// An allocation or a free of the caching allocator (its record); `mu` held. An allocation into
// a pool outside a capture (cudagraph trees' warm-up, torch.cuda.use_mem_pool) names its pool:
// its block goes back to that pool, not to the stream's. During a capture the checker puts the
// capture's allocations in the capture's pool itself.
void write_alloc(const Rec& r) {
  if (r.kind == RecKind::Alloc) {
    if (r.size == 0) return;
    const std::string* pool_name = nullptr;
    if (r.outside_capture) {
      S->pool_allocations_outside_capture++;
      pool_name = &pool_name_of(r.pool);
    }
    new_alloc(r.addr, r.size, Mem::Device, stream_name(r.stream, r.device), *r.site, nullptr, pool_name);
  } else {
    auto it = S->device_bufs.find(r.addr);
    if (it == S->device_bufs.end()) return;  // allocated before the check began
    free_buf(S->device_bufs, it, *r.site);
  }
}

// A kernel launched outside the dispatcher (record_launch); `mu` held.
void write_launch(Rec& r) {
  if (r.kind == RecKind::Launch) S->triton_launches++;
  Used used;
  const std::string& stream_id = stream_name(r.stream, r.device);
  for (Access& a : r.all) {
    if (resolve(a, *r.site, &stream_id)) used.push_back(&a);
  }
  put_launch(S->batch, stream_id, r.text, used, *r.site);
}

std::string host_line(HostOp op, uint64_t event, uint64_t stream, c10::DeviceIndex device, const std::string& site);

void write_rec(Rec& r) {
  switch (r.kind) {
    case RecKind::Op:
      write_op(r);
      break;
    case RecKind::Launch:
    case RecKind::Temp:
      write_launch(r);
      break;
    case RecKind::Alloc:
    case RecKind::Free:
      write_alloc(r);
      break;
    case RecKind::Text:
      S->batch += r.text;
      break;
    case RecKind::Host:
      S->batch += host_line(r.host, r.addr, r.stream, r.device, *r.site);
      break;
    case RecKind::RecordStream: {
      auto it = S->device_bufs.find(r.addr);
      if (it == S->device_bufs.end()) break;  // allocated before the check began, or not a block
      put_record_stream(S->batch, it->second.name, stream_name(r.stream, r.device), *r.site);
      break;
    }
  }
}


void on_end_impl(const at::RecordFunction& fn, at::ObserverContext* pushed) {
  ThreadState& t = tls();  // one TLS lookup for the whole callback
  if (pushed == nullptr || t.frames.empty()) return;
  // The op's frame, off the stack (see FrameStack): its caller's is the innermost now.
  FrameStack::Taken taken(t.frames);
  Frame& fr = *taken;
  if (fr.quiet) at::enableRecordFunction(true);  // its callees ran unobserved (on_start_impl)
  Frame* parent = t.frames.empty() ? nullptr : &t.frames.back();
  t.cur_site = parent ? parent->site : kNullSite;
  if (fr.info != nullptr && fr.info->kind == Kind::Composite && S->active.load(std::memory_order_relaxed)) {
    // Nothing of its own: the host ops issued inside it after the last op it called, then
    // what the ops it called wrote, covered for its caller.
    if (parent) {
      for (auto& c : fr.covered) parent->covered.push_back(c);
    }
    emit_lines(fr.pending, true);
    return;
  }
  if (!fr.active || !S->active.load(std::memory_order_relaxed)) {
    pass_pending(fr, parent);
    return;
  }
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  const OpInfo& info = *fr.info;
  Accesses outs;
  if (S->unreadable_op[0] != '\0') [[unlikely]] maybe_unreadable(fn, /*at_end=*/true);
  if (info.kind != Kind::RecordStream) {
    for (const c10::IValue& v : fn.outputs()) add_ivalue(v, true, outs, fr);
  }
  if (fr.any_device && !fr.stream_set && !info.factory) {
    // Device memory only among the outputs (a copy from pinned memory to a new device tensor):
    // the op ran on the stream current now. (A factory's device memory comes from the tracker.)
    fr.stream = current_stream(fr.device);
    fr.stream_set = true;
  }
  if (info.may_quiet) {
    bool host_output = false;
    for (const Access& o : outs) host_output |= !o.device;
    // Host memory inside the ops that called it: theirs keep their callees observed.
    if (host_output) keep_callees(t, t.frames.size());
    // Seen whole: a call that could have been quiet, observed to its end (not cut short by an
    // exception, before callees it did not reach).
    if (fr.eligible && !fr.quiet && info.learned.seen_whole.load(std::memory_order_relaxed) == 0 &&
        !info.learned.keep_callees.load(std::memory_order_relaxed) &&
        std::uncaught_exceptions() == fr.exceptions) {
      info.learned.seen_whole.store(1, std::memory_order_relaxed);
    }
  }
  if (fr.quiet) {
    // The temporaries its callees left allocated (a workspace kept for its next calls) are
    // among what it wrote; its outputs are already.
    for (const auto& temp : fr.temps) {
      bool output = false;
      for (const Access& o : outs) output |= o.base == temp.addr;
      if (output) continue;
      if (temp.stream != fr.stream || temp.device != fr.device) {
        write_temp(fr, temp, true);  // on its own stream, before the op's record
        continue;
      }
      fr.accesses.push_back(temp.written());
    }
  }
  if (fr.accesses.empty() && outs.empty()) {
    if (profiling) {
      std::lock_guard<std::mutex> g(S->mu);
      S->prof.unwritten[info.name]++;
    }
    pass_pending(fr, parent);
    return;
  }
  if (ablating(kAblateWrite)) {
    pass_pending(fr, parent);
    return;
  }
  // The op's record: queued, built in its slot of the queue, unless written at once.
  const uint64_t t_built = profiling ? now_ns() : 0;
  submit(written_at_once(fr.accesses) || written_at_once(outs), true, [&](Rec& r) {
    r.info = &info;
    r.site = fr.site;
    r.stream = fr.stream;
    r.device = fr.device;
    r.non_blocking = fr.non_blocking;
    r.any_device = fr.any_device;
    r.pending = std::move(fr.pending);
    r.text = std::move(fr.collective_stream);
    if (info.fresh_returns || info.factory) {
      for (const Access& o : outs) {
        if (o.device && !S->fake_device) continue;
        bool input_storage = false;
        for (const Access& a : fr.accesses) input_storage |= a.base == o.base;
        if (!input_storage) r.fresh.push_back(o);
      }
    }
    if (!info.factory) {
      // Each region once: an output that is an input (in-place ops return `self`), or an input
      // given twice (`x.add_(x)`), is one access, written when any of them writes.
      for (Access& a : fr.accesses) merge_region(r.all, std::move(a));
      for (Access& o : outs) merge_region(r.all, std::move(o));
      if (info.kind != Kind::RecordStream) {
        // What the ops it called wrote is theirs; what it touches is covered for its caller.
        if (!fr.covered.empty()) {
          // (q_mu may be held: a storage let go of here could reach the GPU trace, so those
          // dropped are handed over, and each one kept moved onto a slot that holds none)
          size_t k = 0;
          for (size_t i = 0; i < r.all.size(); i++) {
            if (is_covered(fr, r.all[i])) {
              hand_hold(r.all[i]);
              continue;
            }
            if (k != i) r.all[k] = std::move(r.all[i]);
            k++;
          }
          r.all.erase(r.all.begin() + k, r.all.end());
        }
        if (parent) {
          for (const Access& a : r.all) parent->covered.emplace_back(a.base, a.offset, a.bytes, a.write);
          for (auto& c : fr.covered) parent->covered.push_back(c);
        }
      }
    }
    r.kind = RecKind::Op;
  });
  if (profiling) {
    S->prof.regions += t_built - t0;
    S->prof.serialize += now_ns() - t_built;
    S->prof.ops++;
  }
}

// ---------------------------------------------------------------------------------------------
// The allocator's trace tracker (allocator lock held: no GIL here)

// An allocation or a free of the caching allocator (`pool`: the id of the graph pool or MemPool
// the allocation comes from, {0, 0} for none), on the thread that allocates or frees: what that
// thread issued before (an event wait inside an enclosing op) comes first. Only the innermost
// frame holds host ops. Never hands a batch over (no GIL here).
void traced(bool alloc, uint64_t addr, uint64_t size, uint64_t stream, c10::DeviceIndex device,
            std::pair<int64_t, int64_t> pool) {
  if (alloc && size == 0) return;
  ThreadState& t = tls();
  if (!t.frames.empty() && !t.frames.back().pending.empty()) flush_pending(t.frames.back(), false);
  const Site site = t.cur_site;
  const bool outside_capture = alloc && (pool.first != 0 || pool.second != 0) &&
                               S->captures.load(std::memory_order_relaxed) == 0;
  if (!t.frames.empty() && t.frames.back().quiet) {
    // A temporary of a quiet op (see "Quiet callees"): written by it before it is freed.
    Frame& fr = t.frames.back();
    if (alloc) {
      fr.temps.push_back(Frame::Temp{addr, size, stream, device});
      // Work on another stream inside it: written there, and its callees observed from now on.
      if ((stream != fr.stream || device != fr.device) && fr.info != nullptr) {
        fr.info->learned.keep_callees.store(true, std::memory_order_relaxed);
      }
    } else {
      for (size_t i = 0; i < fr.temps.size(); i++) {
        if (fr.temps[i].addr != addr) continue;
        write_temp(fr, fr.temps[i], false);
        fr.temps.erase(fr.temps.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  submit(false, false, [&](Rec& r) {
    r.site = site;
    r.addr = addr;
    r.size = size;
    r.stream = stream;
    r.device = device;
    r.pool = pool;
    r.outside_capture = outside_capture;
    r.kind = alloc ? RecKind::Alloc : RecKind::Free;
  });
}

void on_trace(const c10::CachingDeviceAllocator::TraceEntry& e) {
  using A = c10::CachingDeviceAllocator::TraceEntry::Action;
  if (!S->active.load(std::memory_order_relaxed) || S->observe_only.load(std::memory_order_relaxed)) return;
  if (e.action_ != A::ALLOC && e.action_ != A::FREE_REQUESTED) return;
  if (ablating(kAblateAllocator)) return;
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  traced(e.action_ == A::ALLOC, e.addr_, e.size_, reinterpret_cast<uint64_t>(e.stream_), e.device_,
         {static_cast<int64_t>(e.mempool_.first), static_cast<int64_t>(e.mempool_.second)});
  if (profiling) S->prof.allocator += now_ns() - t0;
}

// ---------------------------------------------------------------------------------------------
// Blocks marked used on a stream outside the dispatcher

// A device block marked used on `stream` by a caller of c10's device guard
// (`recordDataPtrOnStream`, what `record_stream` does without the dispatcher): the allocator
// then hands it out again only after that stream's work up to its free has finished. The
// autograd engine does it for every gradient that a backward node on one stream hands to a node
// on another (torch/csrc/autograd/input_buffer.cpp, `record_stream_any_impl`): FSDP1's backward,
// whose views of the flat parameter were made on its unshard stream, is one.
void traced_record_stream(uint64_t addr, uint64_t stream, c10::DeviceIndex device) {
  if (addr == 0 || !S->active.load(std::memory_order_relaxed) || S->observe_only.load(std::memory_order_relaxed)) {
    return;
  }
  ThreadState& t = tls();
  if (!t.frames.empty() && !t.frames.back().pending.empty()) flush_pending(t.frames.back(), false);
  const Site site = t.cur_site;
  submit(false, false, [&](Rec& r) {
    r.site = site;
    r.addr = addr;
    r.stream = stream;
    r.device = device;
    r.kind = RecKind::RecordStream;
  });
}

void traced_query(uint64_t event, uint64_t stream, c10::DeviceIndex device);  // (below, with c10's GPU trace)

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11
#define STREAMSAN_GUARD_SPY 1
// The CUDA device guard in c10's registry while a check runs: every call goes to the guard that
// was there (torch's), and a block marked used on a stream is recorded as well. Written against
// torch 2.11's DeviceGuardImplInterface (every virtual method delegated: one this class did not
// know would throw), so installed with that torch only; elsewhere such marks are not seen.
// Never destroyed: a caller may hold it after the check (it then only delegates).
struct GuardSpy final : c10::impl::DeviceGuardImplInterface {
  const c10::impl::DeviceGuardImplInterface* orig = nullptr;

  c10::DeviceType type() const override { return orig->type(); }
  c10::Device exchangeDevice(c10::Device d) const override { return orig->exchangeDevice(d); }
  c10::Device getDevice() const override { return orig->getDevice(); }
  void setDevice(c10::Device d) const override { orig->setDevice(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { orig->uncheckedSetDevice(d); }
  c10::Stream getStream(c10::Device d) const override { return orig->getStream(d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return orig->getDefaultStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return orig->getStreamFromGlobalPool(d, high);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override { return orig->getNewStream(d, priority); }
  c10::Stream exchangeStream(c10::Stream s) const override { return orig->exchangeStream(s); }
  void* getStreamNativeHandle(const c10::Stream s) const override { return orig->getStreamNativeHandle(s); }
  void destroyEvent(void* e, const c10::DeviceIndex i) const noexcept override { orig->destroyEvent(e, i); }
  void record(void** e, const c10::Stream& s, const c10::DeviceIndex i, const c10::EventFlag f) const override {
    orig->record(e, s, i, f);
  }
  void block(void* e, const c10::Stream& s) const override { orig->block(e, s); }
  // A query that finds an event's or a stream's work complete tells the host that work is done:
  // recorded as the query it is (`torch.Event.query`, `torch.Stream.query`; c10's GPU trace
  // reports neither). `torch.Event.elapsed_time` queries both events through here first
  // (c10::InlineEvent::elapsedTime), so `elapsedTime` records nothing of its own. Events made
  // before the check kept torch's guard (c10::Event holds the guard it was made with): their
  // queries are not seen.
  bool queryEvent(void* e) const override {
    const bool done = orig->queryEvent(e);
    if (done && e != nullptr) traced_query(reinterpret_cast<uint64_t>(e), 0, -1);
    return done;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return orig->deviceCount(); }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override { return orig->getDeviceCapability(d); }
  bool queryStream(const c10::Stream& s) const override {
    const bool done = orig->queryStream(s);
    if (done && s.device_type() == c10::DeviceType::CUDA) {
      const auto raw = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream();
      traced_query(0, reinterpret_cast<uint64_t>(raw), s.device_index());  // (the null stream: its device's)
    }
    return done;
  }
  void synchronizeStream(const c10::Stream& s) const override { orig->synchronizeStream(s); }
  void synchronizeEvent(void* e) const override { orig->synchronizeEvent(e); }
  void synchronizeDevice(const c10::DeviceIndex i) const override { orig->synchronizeDevice(i); }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    orig->recordDataPtrOnStream(p, s);
    if (S != nullptr && s.device_type() == c10::DeviceType::CUDA) {
      const auto raw = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream();
      traced_record_stream(reinterpret_cast<uint64_t>(p.get()), reinterpret_cast<uint64_t>(raw), s.device_index());
    }
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex i) const override { return orig->elapsedTime(a, b, i); }
};
GuardSpy* guard_spy = new GuardSpy();  // leaked, as c10's registry asks
#endif

// The spy put in c10's registry for the check (false where it is not: another torch, no CUDA
// guard registered, or another guard than the one seen first there now). GIL held.
bool install_guard_spy() {
#ifdef STREAMSAN_GUARD_SPY
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  const c10::impl::DeviceGuardImplInterface* cur = slot.load();
  if (cur == guard_spy) return true;
  if (cur == nullptr || (guard_spy->orig != nullptr && cur != guard_spy->orig)) return false;
  guard_spy->orig = cur;
  slot.store(guard_spy);
  return true;
#else
  return false;
#endif
}

// Puts torch's guard back (a program after the check pays nothing). GIL held.
void uninstall_guard_spy() {
#ifdef STREAMSAN_GUARD_SPY
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  const c10::impl::DeviceGuardImplInterface* spy = guard_spy;
  slot.compare_exchange_strong(spy, guard_spy->orig);
#endif
}

// Tests: marks `t`'s block used on `stream` through c10's CUDA device guard, as the autograd
// engine does (with the fake device, a CPU tensor's storage: torch's guard ignores it, the spy
// records it). Returns whether the spy was in place.
bool mark_used_on_stream(const at::Tensor& t, int64_t stream_id) {
#ifdef STREAMSAN_GUARD_SPY
  const auto* impl = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)].load();
  if (impl != guard_spy) return false;
  c10::Stream s = c10::Stream::unpack3(stream_id, 0, c10::DeviceType::CUDA);
  impl->recordDataPtrOnStream(t.storage().data_ptr(), s);
  return true;
#else
  (void)t;
  (void)stream_id;
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// Python API

using CodeCache = decltype(State::code_cache);

// Empties the caches of code objects and bumps the epoch; returns the codes they held, for the
// caller to release (release_codes) once it holds no lock: releasing one may run Python (weak
// references' callbacks, which may find sites and fill the caches again, and must not see the
// codes about to go; or ops of their own, whose callbacks may take `mu`). GIL held.
CodeCache forget_codes() {
  CodeCache codes = std::move(S->code_cache);
  S->code_cache.clear();
  S->site_cache.clear();
  S->code_epoch.fetch_add(1, std::memory_order_release);
  return codes;
}

// Releases the codes forget_codes returned; GIL held, no lock.
void release_codes(CodeCache& codes) {
  for (auto& kv : codes) Py_DECREF(kv.first);
  codes.clear();
}

// Takes the kind of an operator being deregistered (a torch.library.Library destroyed) out of
// the table by address. Called by the dispatcher, its lock held, before the schema goes.
struct OpsListener final : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    if (!op.hasSchema()) return;
    const char* key = op.schema().name().c_str();
    std::lock_guard<std::mutex> g(S->mu);
    auto node = S->ops.extract(key);
    if (node.empty()) return;
    S->retired_ops.push_back(std::move(node));
    S->op_epoch.fetch_add(1, std::memory_order_release);
  }
};

void install(bool with_cuda) {
  watch_forks();
  static bool listening = false;
  if (!listening) {
    // Never removed: the handle outlives every check (the dispatcher owns the listener).
    new c10::RegistrationHandleRAII(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<OpsListener>()));
    listening = true;
  }
  if (with_cuda && !S->tracker_attached) {
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(on_trace);
    S->tracker_attached = true;
  }
  if (!S->callback_added) {
    S->handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                          .needsInputs(true)
                                          .needsOutputs(true)
                                          .scopes({at::RecordScope::FUNCTION}));
    S->callback_added = true;
  }
}

// Benchmarks (bench_overhead.py floor): an observer that does nothing, on the dispatcher alone
// (no check, no trace, no allocator tracker): what being called for every op costs, with the
// op's inputs and outputs (`io`) or without. `on` false takes it off. GIL held.
struct FloorCallback {
  bool added = false;
  at::CallbackHandle handle = 0;
} floor_callback;

std::unique_ptr<at::ObserverContext> floor_start(const at::RecordFunction&) { return nullptr; }
void floor_end(const at::RecordFunction&, at::ObserverContext*) {}

// Whether the benchmark's observer is on the dispatcher (tests).
bool bench_floor_on() { return floor_callback.added; }

void bench_floor(bool on, bool io) {
  if (floor_callback.added) {
    at::removeCallback(floor_callback.handle);
    floor_callback.added = false;
  }
  if (!on) return;
  floor_callback.handle = at::addGlobalCallback(at::RecordFunctionCallback(floor_start, floor_end)
                                                    .needsInputs(io)
                                                    .needsOutputs(io)
                                                    .scopes({at::RecordScope::FUNCTION}));
  floor_callback.added = true;
}

// Benchmarks: the parts of recording left out (a mask of `Ablate`), 0 for none.
void bench_ablate(uint32_t mask) { ablated.store(mask); }

// Benchmarks: nanoseconds per call of the recorder's building blocks on this host, `n` calls
// each: the clock, taking and dropping the GIL from a thread that released it, the user's site
// (GIL held), an uncontended mutex, a small heap allocation. GIL held on entry.
py::dict bench_micro(int n) {
  py::dict d;
  if (n <= 0) return d;
  auto per = [n](uint64_t t0) { return static_cast<double>(now_ns() - t0) / n; };
  uint64_t t0 = now_ns();
  uint64_t sink = 0;
  for (int i = 0; i < n; i++) sink += now_ns();
  d["clock_ns"] = per(t0);
  Site site = kNullSite;
  t0 = now_ns();
  for (int i = 0; i < n; i++) site = user_site();
  d["site_ns"] = per(t0);
  double gil = 0, mutex = 0, heap = 0;
  {
    py::gil_scoped_release nogil;
    uint64_t t = now_ns();
    for (int i = 0; i < n; i++) {
      PyGILState_STATE st = PyGILState_Ensure();
      PyGILState_Release(st);
    }
    gil = per(t);
    std::mutex m;
    t = now_ns();
    for (int i = 0; i < n; i++) {
      std::lock_guard<std::mutex> g(m);
      sink++;
    }
    mutex = per(t);
    t = now_ns();
    for (int i = 0; i < n; i++) {
      auto p = std::make_unique<std::array<char, 64>>();
      sink += reinterpret_cast<uintptr_t>(p.get()) & 1;
    }
    heap = per(t);
  }
  d["gil_ensure_release_ns"] = gil;
  d["mutex_ns"] = mutex;
  d["heap_64b_ns"] = heap;
  d["site"] = site == kNullSite ? std::string("null") : *site;
  d["_"] = sink & 1;
  return d;
}

// Takes the observer off the dispatcher (the tracker cannot be detached: it checks `active`).
void uninstall() {
  if (S->callback_added) {
    at::removeCallback(S->handle);
    S->callback_added = false;
  }
}

void configure(const std::string& torch_dir, const std::string& own_dir, const std::string& cwd,
               size_t threshold, py::object sink, bool fake_device, py::object pinned_example) {
  CodeCache old;
  py::object old_sink;  // released after the lock, as the codes are
  {
    std::lock_guard<std::mutex> g(S->mu);
    if (S->cwd != cwd) old = forget_codes();
    S->cwd = cwd;
    S->torch_dir = torch_dir;
    S->own_dir = own_dir;
    S->threshold = threshold;
    old_sink = std::exchange(S->sink, sink);
    S->fake_device = fake_device;
    if (!pinned_example.is_none()) {
      at::Tensor t = pinned_example.cast<at::Tensor>();
      S->pinned_deleter = reinterpret_cast<void*>(t.storage().data_ptr().get_deleter());
    }
  }
  release_codes(old);
}

void set_active(bool on) { S->active.store(on); }

// Frames under this directory (Python's standard library) are not the user's: an op of a
// thread that runs only torch and the standard library (the DataLoader's pin-memory thread)
// takes the site of the latest user line.
void set_stdlib_dir(const std::string& dir, const std::vector<std::string>& libraries) {
  CodeCache old;
  {
    std::lock_guard<std::mutex> g(S->mu);
    if (S->stdlib_dir != dir || S->libraries != libraries) old = forget_codes();
    S->stdlib_dir = dir;
    S->libraries = libraries;
  }
  release_codes(old);
}

// At most this many code objects are known (and kept alive by code_cache, with what they hold:
// a generated module's top-level code holds its sources) from one check to the next: a check
// that starts with more forgets them all.
constexpr size_t kMaxKnownCodes = 1 << 16;

// Code outside torch that is not the user's either (`dirs`: folder prefixes), and Dynamo's map
// of rewritten code (None: looked up when needed). What is known of code objects (whether they
// are the user's, their lines' sites) holds from one check to the next while the folders and the
// map are the same: a short check would otherwise find each of its sites again (a code object
// Dynamo rewrites is a new one, in the map before it runs).
void set_internal(const std::vector<std::string>& dirs, py::object rewritten) {
  CodeCache old;
  py::object old_map;  // released after the lock, as the codes are
  {
    std::lock_guard<std::mutex> g(S->mu);
    const bool same_map =
        rewritten.is_none() || (S->rewritten_codes && rewritten.is(S->rewritten_codes));
    if (dirs != S->internal_dirs || !same_map || S->code_cache.size() > kMaxKnownCodes) {
      old = forget_codes();
    }
    S->internal_dirs = dirs;
    if (!same_map) old_map = std::exchange(S->rewritten_codes, rewritten);
  }
  release_codes(old);
}

// Starts a new check: forgets every buffer, name and counter.
void reset() {
  StateLock g;
  // Room for a full queue in both of its buffers (they are swapped): a record's move may copy
  // (SmallVector's is not noexcept), and the queue never grows while the program queues.
  S->resolving.reserve(kMaxQueued + 64);
  {
    std::lock_guard<std::mutex> q(S->q_mu);
    S->queue.reserve(kMaxQueued + 64);
  }
  S->batch.clear();
  S->batch_since_ns = now_ns();
  Leftovers old;
  old.device_bufs.swap(S->device_bufs);
  old.pinned_bufs.swap(S->pinned_bufs);
  old.fake_free.swap(S->fake_free);
  old.fake_pinned.swap(S->fake_pinned);
  old.pool_names.swap(S->pool_names);
  S->buf_slots = {};
  {
    std::lock_guard<std::mutex> n(S->names_mu);
    S->stream_names.clear();
  }
  S->next_buf = 0;
  S->fake_next_addr = kFakeAddrBase;
  S->host_values_allocated = false;
  old.spare_names[0].swap(S->spare_names[0]);
  old.spare_names[1].swap(S->spare_names[1]);
  S->last_site.store(kNullSite);
  S->external_accesses = S->bad_regions = 0;
  S->foreign_threads.store(0);
  S->fast_sites.store(0);
  S->slow_sites.store(0);
  S->pool_allocations_outside_capture = 0;
  S->triton_launches = 0;
  S->captures.store(0);
  S->resolver_errors.store(0);
  S->callback_errors.store(0);
  {
    std::lock_guard<std::mutex> g(S->callback_error_mu);
    S->first_callback_error.clear();
  }
  {
    std::lock_guard<std::mutex> r(S->raw_mu);
    S->raw_refused_bytes = 0;
  }
  for (auto* c : {&S->prof.ops, &S->prof.callbacks, &S->prof.regions, &S->prof.site, &S->prof.serialize,
                  &S->prof.allocator, &S->prof.syncs, &S->prof.handover, &S->prof.batches,
                  &S->prof.callback_total, &S->prof.kernels, &S->prof.kernels_regions, &S->prof.kernels_site,
                  &S->prof.kernels_submit, &S->prof.resolver, &S->prof.resolved, &S->prof.deferred,
                  &S->prof.caught_up, &S->prof.quieted}) {
    c->store(0);
  }
  S->prof.unwritten.clear();
  // A few are freed here, sooner than the resolver could be woken for them.
  if (old.size() < kLeftoversApart) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> q(S->q_mu);
    if (S->resolver_started) {
      S->leftovers.push_back(std::make_unique<Leftovers>(std::move(old)));
      S->leftovers_handed.fetch_add(1);
      S->leftovers_unfreed.fetch_add(1);
      wake = S->resolver_asleep;  // else found at its next look (kLingerNs)
    }
  }
  if (wake) S->q_cv.notify_all();
}

// The number of CUDA graph captures in progress (the Python wrappers of CUDAGraph say it).
void set_captures(int n) {
  S->captures.store(n);
  if (n == 0) release_held();  // what was held back while capturing
}

// The end of a check, once nothing more is recorded: writes what is queued and hands every batch
// to the raw sink as it fills, the last one whole, so that the checker checks the first while
// the rest are written. False when there is no raw sink (`drain` then gives what is left). GIL
// released.
bool flush_to_sink() {
  bool handed;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> g(S->mu);
    resolve_queued(true);
    handed = hand_over_locked(true);
  }
  release_held();
  return handed;
}

py::bytes drain() {
  std::string out;
  {
    StateLock g;
    out.swap(S->batch);
  }
  release_held();
  return py::bytes(out);
}

void name_stream(uint64_t raw, const std::string& name) {
  StateLock g;  // queued ops on that stream named first: names do not depend on the resolver's pace
  std::lock_guard<std::mutex> n(S->names_mu);
  S->stream_names.emplace(raw, jstr(name));
}

std::string stream_id(uint64_t raw, int device) {
  return stream_name(raw, static_cast<c10::DeviceIndex>(device));
}

void set_fake_stream(uint64_t raw) { S->fake_stream = raw; }

// Tests: an allocation (`alloc`) or a free of the caching allocator, as its tracker reports them
// (`pool`: the id of the graph pool or MemPool it comes from; (0, 0) for none).
void fake_trace(bool alloc, uint64_t addr, uint64_t size, uint64_t stream,
                std::pair<int64_t, int64_t> pool) {
  if (!S->fake_device) return;
  traced(alloc, addr, size, stream, 0, pool);
}

// The graph recorder named the pool with the allocator's id (a, b): allocations into it outside
// a capture are written with that name.
void set_pool_name(int64_t a, int64_t b, const std::string& quoted) {
  StateLock g;
  S->pool_names[{a, b}] = quoted;
}

// The quoted name already given to the pool with id (a, b), or None.
py::object pool_name(int64_t a, int64_t b) {
  StateLock g;
  auto it = S->pool_names.find({a, b});
  if (it == S->pool_names.end()) return py::none();
  return py::str(it->second);
}

// Writes a kernel launched outside the dispatcher (a Triton kernel: Inductor's or the user's),
// its name `quoted` (JSON), on the raw stream `stream` of `device`, with the regions `all`. Written like a
// nested op: after the host ops its enclosing op issued before it, and an enclosing op (a custom
// op around the kernel) does not write these regions again. GIL held.
void record_launch(std::string quoted, uint64_t stream, int device, c10::SmallVector<Access, 8>& all) {
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  ThreadState& t = tls();
  Site site;
  {
    StageTimer timed(S->prof.kernels_site, profiling);
    site = op_site(t);
  }
  StageTimer timed(S->prof.kernels_submit, profiling);
  if (!t.frames.empty() && !t.frames.back().pending.empty()) flush_pending(t.frames.back());
  if (!t.frames.empty()) {
    Frame& parent = t.frames.back();
    for (const Access& a : all) parent.covered.emplace_back(a.base, a.offset, a.bytes, a.write);
  }
  submit(written_at_once(all), true, [&](Rec& r) {
    r.site = site;
    r.stream = stream;
    r.device = static_cast<c10::DeviceIndex>(device);
    r.text = std::move(quoted);
    for (Access& a : all) r.all.push_back(std::move(a));
    r.kind = RecKind::Launch;
  });
  release_held();
}

// Whether a check records now (not only observing: benchmarks).
bool recording() {
  return S->active.load(std::memory_order_relaxed) && !S->observe_only.load(std::memory_order_relaxed);
}

// A Triton kernel's launch with `accesses` = [(tensor, read, write)] (see record_launch).
bool record_kernel(const std::string& name, uint64_t stream, int device, py::list accesses) {
  if (!recording()) return false;
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  StageTimer timed(S->prof.kernels, profiling);
  StageTimer regions(S->prof.kernels_regions, profiling);  // (stopped below, before the record)
  c10::SmallVector<Access, 8> all;
  for (py::handle item : accesses) {
    auto tup = item.cast<py::tuple>();
    if (tup.size() != 3) continue;
    py::object obj = tup[0];
    if (!THPVariable_Check(obj.ptr())) continue;
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    bool write = tup[2].cast<bool>();
    bool read = tup[1].cast<bool>();
    if (!read && !write) continue;
    Access a;
    if (region_of(t, write, a)) merge_region(all, std::move(a));
  }
  regions.stop();
  record_launch(jstr(name), stream, device, all);
  return true;
}

// One launch of the Triton kernel named `quoted` (JSON) whose positional arguments are
// `args[0..n)`, the role of each given by `role_data[0..n_roles)` (one byte per position: 0
// untouched, 1 read, 2 written, 3 both; positions past its end are read and written): the
// tensors' regions, on `stream`, on the device of the first
// device tensor (else the current device). GIL held. Returns 1 when recorded, 0 when the check
// does not record now, -1 when an argument in a touched position may hold tensors the hooks
// find and this does not (a tuple or list, an object with a `base`: a tensor descriptor), for
// the caller to record the launch itself. Any other object there (a scalar of another type, a
// `tl.dtype` constexpr) holds no memory, as for the hooks' `_apply`.
int record_triton_args(const std::string& quoted, uint64_t stream, const char* role_data, Py_ssize_t n_roles,
                       PyObject* const* args, Py_ssize_t n) {
  if (!recording()) return 0;
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  StageTimer timed(S->prof.kernels, profiling);
  StageTimer regions(S->prof.kernels_regions, profiling);  // (stopped below, before the record)
  // One pass: the regions found before an argument sends the launch back are only dropped.
  c10::SmallVector<Access, 8> all;
  int device = -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    const uint8_t role = i < n_roles ? static_cast<uint8_t>(role_data[i]) : 3;
    if (role == 0) continue;
    PyObject* o = args[i];
    if (!THPVariable_Check(o)) {
      // No memory of its own; a tuple, a list or a descriptor (`base`) may hold tensors. (Python
      // scalars first: no attribute lookup for them.)
      const bool scalar = o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) ||
                          PyFloat_CheckExact(o) || PyUnicode_CheckExact(o);
      if (!scalar && (PyTuple_Check(o) || PyList_Check(o) || PyObject_HasAttrString(o, "base"))) return -1;
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(o);
    if (device < 0 && t.defined() && t.is_cuda()) device = t.device().index();
    Access a;
    if (region_of(t, (role & 2) != 0, a)) merge_region(all, std::move(a));
  }
  if (device < 0) {
    device = 0;
    if (!S->fake_device) {
      try {
        device = static_cast<int>(c10::cuda::current_device());
      } catch (const std::exception&) {
        device = 0;  // no device: the launch itself will fail
      }
    }
  }
  regions.stop();
  record_launch(quoted, stream, device, all);
  return 1;
}

// record_triton_args for a tuple of arguments and roles as bytes: the hooks' `direct` entry.
int record_triton(const std::string& name, uint64_t stream, py::bytes roles, py::tuple args) {
  if (!recording()) return 0;
  char* role_data = nullptr;
  Py_ssize_t n_roles = 0;
  if (PyBytes_AsStringAndSize(roles.ptr(), &role_data, &n_roles) != 0) {
    PyErr_Clear();
    return -1;
  }
  return record_triton_args(jstr(name), stream, role_data, n_roles, PySequence_Fast_ITEMS(args.ptr()),
                            PyTuple_GET_SIZE(args.ptr()));
}

// ---------------------------------------------------------------------------------------------
// Inductor's launches without a Python frame

// `CachingAutotuner.run` calls in progress on this thread that went through FastRun's own path
// (the hooks' Python wrapper counts its own): Triton's `launch_metadata` inside them records
// nothing (the launch is recorded once, by the autotuner's entry).
thread_local int fast_run_depth = 0;

// A tuned Inductor kernel's plan, as the hooks' Python wrapper knows it (`_record_autotuner`):
// the autotuner (by a weak reference: its entry is stale once it is gone, or another object
// has its address), the one launcher `run` launches, the kernel's name and its arguments' roles.
struct FastPlan {
  PyObject* ref = nullptr;       // a weak reference to the autotuner (owned)
  PyObject* launcher = nullptr;  // owned
  std::string name;  // quoted (JSON)
  std::string roles;
  FastPlan() = default;
  FastPlan(const FastPlan&) = delete;
  FastPlan& operator=(const FastPlan&) = delete;
  ~FastPlan() {  // (GIL held: plans are made, looked up and let go of with it)
    Py_XDECREF(ref);
    Py_XDECREF(launcher);
  }
};

// The plans by autotuner, and the autotuner of each plan's weak reference, read and written with
// the GIL held. An entry goes with its autotuner (the weak reference's callback,
// fast_plan_gone), and with it the launcher it keeps alive. A launch holds its plan while it
// runs (code it runs may put or clear plans).
using FastPlans = std::unordered_map<PyObject*, std::shared_ptr<const FastPlan>>;
FastPlans* fast_plans = new FastPlans();
std::unordered_map<PyObject*, PyObject*>* fast_plan_keys = new std::unordered_map<PyObject*, PyObject*>();

// Takes the plan of `key` out of the tables (let go of by the caller, last).
std::shared_ptr<const FastPlan> take_plan(PyObject* key) {
  auto it = fast_plans->find(key);
  if (it == fast_plans->end()) return nullptr;
  std::shared_ptr<const FastPlan> p = std::move(it->second);
  fast_plans->erase(it);
  fast_plan_keys->erase(p->ref);
  return p;
}

// The weak reference's callback: its autotuner is gone (GIL held).
PyObject* fast_plan_gone(PyObject* /*module*/, PyObject* ref) {
  auto k = fast_plan_keys->find(ref);
  if (k != fast_plan_keys->end()) {
    std::shared_ptr<const FastPlan> p = take_plan(k->second);
    p.reset();  // (may run Python code: the tables are consistent)
  }
  Py_RETURN_NONE;
}

PyMethodDef fast_plan_gone_def = {"fast_plan_gone", fast_plan_gone, METH_O, nullptr};
PyObject* fast_plan_gone_fn = nullptr;  // made once, in the module's init

// Tells the C++ wrapper the plan of a tuned autotuner whose launches it may take: `launcher`
// the one it launches, `roles` one byte per positional argument (record_triton's). GIL held.
void fast_plan_put(py::object autotuner, py::object launcher, const std::string& name, py::bytes roles) {
  auto fresh = std::make_shared<FastPlan>();  // (everything that may throw before a reference is taken)
  fresh->name = jstr(name);
  fresh->roles = std::string(roles);
  fast_plans->reserve(fast_plans->size() + 1);
  fast_plan_keys->reserve(fast_plan_keys->size() + 1);
  fresh->ref = PyWeakref_NewRef(autotuner.ptr(), fast_plan_gone_fn);
  if (fresh->ref == nullptr) {  // not weakly referenceable: its launches go through the Python wrapper
    PyErr_Clear();
    return;
  }
  fresh->launcher = launcher.ptr();
  Py_INCREF(fresh->launcher);
  std::shared_ptr<const FastPlan> old = take_plan(autotuner.ptr());
  PyObject* ref = fresh->ref;
  // Both tables or neither (an entry may still be allocated, and fail, with room reserved).
  (*fast_plan_keys)[ref] = autotuner.ptr();
  try {
    (*fast_plans)[autotuner.ptr()] = std::move(fresh);
  } catch (...) {
    fast_plan_keys->erase(ref);
    throw;  // (`fresh` let go of: its weak reference with it, its callback never runs)
  }
  old.reset();  // last (it may run Python code): its weak reference gone, its callback never runs
}

// Forgets every plan (the hooks' caches cleared). GIL held.
void fast_plans_clear() {
  FastPlans plans;
  plans.swap(*fast_plans);  // (a launcher let go of may run code that puts a plan)
  fast_plan_keys->clear();
  plans.clear();
}

int fast_depth() { return fast_run_depth; }

// How many plans are held (tests: an autotuner's goes with it).
size_t fast_plans_count() { return fast_plans->size(); }

// `CachingAutotuner.run` as the hooks patch it where the C++ recorder is there: a callable (and
// method descriptor) that takes a tuned kernel's launch straight to the recorder's entry and
// calls the original `run` with the same arguments, with no Python frame of its own; anything
// else (a check not listening through this entry, a kernel without a plan yet, arguments by
// name, `benchmark_run`, an argument the entry sends back) goes to `fallback`, the hooks' Python
// wrapper, with the same arguments. `on` is set by the hooks while one set of hooks listens
// through the recorder's entry; `taken` counts the launches taken here.
struct FastRunObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* original;
  PyObject* fallback;
  PyObject* dict;
  bool on;
  uint64_t taken;
};

PyObject* fast_run_stream_name = nullptr;    // "stream"
PyObject* fast_run_launchers_name = nullptr;  // "launchers"

// Whether the weak reference `ref` still refers to `obj` (compared only: no reference is kept).
// PyWeakref_GetObject is deprecated from Python 3.13 (and goes in 3.15); PyWeakref_GetRef is new in it.
bool weakref_refers_to(PyObject* ref, PyObject* obj) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* target = nullptr;
  if (PyWeakref_GetRef(ref, &target) < 0) {
    PyErr_Clear();
    return false;
  }
  const bool same = target == obj;
  Py_XDECREF(target);
  return same;
#else
  return PyWeakref_GetObject(ref) == obj;
#endif
}

// The launch's plan, where this call may be taken here: `self` a planned autotuner still alive,
// its `launchers` the plan's one launcher, the only argument by name `stream` (an int). Else
// null, with no Python error set.
std::shared_ptr<const FastPlan> fast_plan_for(PyObject* self, PyObject* kwnames, PyObject* const* args,
                                              Py_ssize_t nargs, uint64_t& stream) {
  if (kwnames == nullptr || PyTuple_GET_SIZE(kwnames) != 1) return nullptr;
  PyObject* kw = PyTuple_GET_ITEM(kwnames, 0);
  if (kw != fast_run_stream_name && PyUnicode_Compare(kw, fast_run_stream_name) != 0) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* s = args[nargs];  // the value of `stream`
  if (!PyLong_CheckExact(s)) return nullptr;
  if (fast_plans->find(self) == fast_plans->end()) return nullptr;  // (no attribute read for those)
  PyObject* launchers = PyObject_GetAttr(self, fast_run_launchers_name);  // (may run code)
  if (launchers == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  auto it = fast_plans->find(self);
  std::shared_ptr<const FastPlan> plan;
  if (it != fast_plans->end() && weakref_refers_to(it->second->ref, self) && PyList_CheckExact(launchers) &&
      PyList_GET_SIZE(launchers) == 1 && PyList_GET_ITEM(launchers, 0) == it->second->launcher) {
    plan = it->second;
  }
  Py_DECREF(launchers);
  if (plan == nullptr) return nullptr;
  stream = PyLong_AsUnsignedLongLong(s);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return nullptr;
  }
  return plan;
}

PyObject* fast_run_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FastRunObject*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (self->original == nullptr || self->fallback == nullptr) {  // (cleared by the collector)
    PyErr_SetString(PyExc_RuntimeError, "streamsan: FastRun called after it was cleared");
    return nullptr;
  }
  if (self->on && nargs >= 1) {
    uint64_t stream = 0;
    std::shared_ptr<const FastPlan> plan = fast_plan_for(args[0], kwnames, args, nargs, stream);
    int taken = -1;
    if (plan != nullptr) {
      try {
        taken = record_triton_args(plan->name, stream, plan->roles.data(),
                                   static_cast<Py_ssize_t>(plan->roles.size()), args + 1, nargs - 1);
      } catch (...) {
        taken = -1;  // the Python wrapper's path says what went wrong
      }
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (taken >= 0) {
      self->taken++;
      fast_run_depth++;
      PyObject* result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
      fast_run_depth--;
      return result;
    }
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

PyObject* fast_run_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* original = nullptr;
  PyObject* fallback = nullptr;
  static const char* names[] = {"original", "fallback", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:FastRun", const_cast<char**>(names), &original, &fallback))
    return nullptr;
  if (!PyCallable_Check(original) || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "FastRun: original and fallback must be callable");
    return nullptr;
  }
  auto* self = reinterpret_cast<FastRunObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = fast_run_call;
  Py_INCREF(original);
  Py_INCREF(fallback);
  self->original = original;
  self->fallback = fallback;
  self->dict = nullptr;
  self->on = false;
  self->taken = 0;
  return reinterpret_cast<PyObject*>(self);
}

int fast_run_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<FastRunObject*>(o);
  Py_VISIT(self->original);
  Py_VISIT(self->fallback);
  Py_VISIT(self->dict);
  return 0;
}

int fast_run_clear(PyObject* o) {
  auto* self = reinterpret_cast<FastRunObject*>(o);
  Py_CLEAR(self->original);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->dict);
  return 0;
}

void fast_run_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  fast_run_clear(o);
  Py_TYPE(o)->tp_free(o);
}

// A method: bound to the instance it is looked up on (as a Python function is).
PyObject* fast_run_get(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

PyObject* fast_run_set_on(PyObject* o, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  reinterpret_cast<FastRunObject*>(o)->on = on != 0;
  Py_RETURN_NONE;
}

// The launches taken since the last call, and the count back to zero.
PyObject* fast_run_take(PyObject* o, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<FastRunObject*>(o);
  const uint64_t n = self->taken;
  self->taken = 0;
  return PyLong_FromUnsignedLongLong(n);
}

PyObject* fast_run_get_on(PyObject* o, void* /*closure*/) {
  return PyBool_FromLong(reinterpret_cast<FastRunObject*>(o)->on);
}

PyObject* fast_run_get_original(PyObject* o, void* /*closure*/) {
  PyObject* r = reinterpret_cast<FastRunObject*>(o)->original;
  if (r == nullptr) Py_RETURN_NONE;
  Py_INCREF(r);
  return r;
}

PyMethodDef fast_run_methods[] = {
    {"set_on", fast_run_set_on, METH_O, "Takes tuned launches here (true) or passes every call to the fallback."},
    {"take", fast_run_take, METH_NOARGS, "The launches taken since the last call (the count goes back to zero)."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef fast_run_getset[] = {
    {"on", fast_run_get_on, nullptr, "Whether tuned launches are taken here.", nullptr},
    {"original", fast_run_get_original, nullptr, "The method wrapped.", nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject FastRunType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "streamsan_recorder.FastRun";
  t.tp_basicsize = sizeof(FastRunObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
  t.tp_doc = "CachingAutotuner.run wrapped: tuned launches recorded without a Python frame.";
  t.tp_new = fast_run_new;
  t.tp_dealloc = fast_run_dealloc;
  t.tp_traverse = fast_run_traverse;
  t.tp_clear = fast_run_clear;
  t.tp_call = PyVectorcall_Call;
  t.tp_vectorcall_offset = offsetof(FastRunObject, vectorcall);
  t.tp_descr_get = fast_run_get;
  t.tp_dictoffset = offsetof(FastRunObject, dict);
  t.tp_methods = fast_run_methods;
  t.tp_getset = fast_run_getset;
  return t;
}();

// Tests: the CPU tensor `t` (allocated while the recorder was off) stands for a pinned block
// allocated now.
void fake_pin(const at::Tensor& t) {
  if (!S->fake_device || !t.has_storage() || !t.storage().data()) return;
  uint64_t base = reinterpret_cast<uint64_t>(t.storage().data());
  const std::string& site = *user_site();
  StateLock g;
  S->fake_pinned.insert(base);
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto known = S->pinned_bufs.find(base);
  if (known == S->pinned_bufs.end() || !same_storage(known->second, impl)) {
    new_alloc(base, t.storage().nbytes(), Mem::Pinned, "null", site, impl);
  }
}

// A host-side op (an event or sync) as a JSON line without its closing brace; the site is added
// here. Inside an op it is written before the next op that op calls, or after the op's own
// work.
// Writes a host op's finished line: inside an op, before the next op it calls (or after its own
// work); outside ops, now (the batch handed over when large enough, GIL held or taken).
void put_host_op(std::string line) {
  ThreadState& t = tls();
  if (!t.frames.empty()) {
    keep_callees(t, t.frames.size());
    t.frames.back().pending.push_back(std::move(line));
    return;
  }
  emit_text(std::move(line), true);
}

void host_op(const std::string& partial) {
  std::string line = partial;
  put_site(line, *user_site());
  put_host_op(std::move(line));
}

// ---------------------------------------------------------------------------------------------
// Events and synchronizations from c10's GPU trace, without Python

// The quoted name of an event.
std::string event_name(uintptr_t event) {
  std::string h;
  put_hex(h, event);
  return jstr("ev " + h);
}

// The current device (the null stream's device for its name).
c10::DeviceIndex trace_device() {
  if (S->fake_device) return 0;
  try {
    return c10::cuda::current_device();
  } catch (...) {
    return 0;
  }
}

// The line of a host op of c10's GPU trace on `stream` (the null stream: of `device`) or of
// `event`, with `site`: `{"op":…,…,"site":…}`.
std::string host_line(HostOp op, uint64_t event, uint64_t stream, c10::DeviceIndex device, const std::string& site) {
  std::string line;
  switch (op) {
    case HostOp::EventRecord:
      line = "{\"op\":\"event_record\",\"event\":" + event_name(event) + ",\"stream\":" + stream_name(stream, device);
      break;
    case HostOp::EventWait:
      line = "{\"op\":\"event_wait\",\"stream\":" + stream_name(stream, device) + ",\"event\":" + event_name(event);
      break;
    case HostOp::EventSync:
      line = "{\"op\":\"event_sync\",\"event\":" + event_name(event);
      break;
    case HostOp::StreamSync:
      line = "{\"op\":\"stream_sync\",\"stream\":" + stream_name(stream, device);
      break;
    case HostOp::DeviceSync:
      line = "{\"op\":\"device_sync\",\"device\":" + std::to_string(device);
      break;
    case HostOp::EventQuery:
      line = "{\"op\":\"event_query\",\"event\":" + event_name(event) + ",\"complete\":true";
      break;
    case HostOp::StreamQuery:
      line = "{\"op\":\"stream_query\",\"stream\":" + stream_name(stream, device) + ",\"complete\":true";
      break;
  }
  put_site(line, site);
  return line;
}

// A synchronization this soon after the resolver's latest pass leaves the queue to its next
// pass: a loop that synchronizes at every step does not wake it at every step.
constexpr uint64_t kKickGapNs = 200'000;

// The program issued a host synchronization and is about to wait for the GPU (c10 calls the
// GPU trace before it blocks): the resolver's next pass hands over everything written, the
// checker's thread woken for it, so that the checker checks it during the wait rather than at
// a later look or at the check's end; and that pass starts now. At most one wake-up per
// synchronization, on the program's thread: none when a pass began less than kKickGapNs ago or
// nothing was queued since (the next pass, within half a millisecond, hands over), and none
// while records are written at once.
void kick_resolver() {
  if (!S->defer.load(std::memory_order_relaxed)) return;
  const bool soon = now_ns() - S->last_pass_ns.load(std::memory_order_relaxed) < kKickGapNs;
  {
    std::lock_guard<std::mutex> q(S->q_mu);
    S->sync_pending = true;
    if (S->kicked || soon || S->queue.empty()) return;  // asked already, or left to the next pass
    S->kicked = true;
  }
  S->q_cv.notify_all();  // the lock let go of: woken while it is held, it would only wait again
}

// Records a host op of c10's GPU trace (`event`, `stream`: those it names), with the user's
// site. Outside ops it is queued as a record (no text on the program's thread: its line is
// written with the others, see "Deferred writing"); inside an op, its line waits in the op's
// frame (see put_host_op). The null stream is named after `known_device` where the caller knows
// it (-1: not), else after the device current now.
void traced_host_op(HostOp op, uint64_t event, uint64_t stream, c10::DeviceIndex known_device = -1) {
  if (!S->active.load(std::memory_order_relaxed) || S->observe_only.load(std::memory_order_relaxed)) return;
  const bool profiling = S->profiling.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? now_ns() : 0;
  const bool on_stream =
      op == HostOp::EventRecord || op == HostOp::EventWait || op == HostOp::StreamSync || op == HostOp::StreamQuery;
  const c10::DeviceIndex device = (op == HostOp::DeviceSync || (on_stream && stream == 0))
                                      ? (known_device >= 0 ? known_device : trace_device())
                                      : 0;
  const Site site = host_site();
  if (tls().frames.empty()) {
    submit(false, true, [&](Rec& r) {
      r.site = site;
      r.host = op;
      r.addr = event;
      r.stream = stream;
      r.device = device;
      r.kind = RecKind::Host;
    });
  } else {
    put_host_op(host_line(op, event, stream, device, *site));
  }
  if (op == HostOp::EventSync || op == HostOp::StreamSync || op == HostOp::DeviceSync) kick_resolver();
  if (profiling) S->prof.syncs += now_ns() - t0;
}

// Whether the GPU trace's call is one to record: a CUDA (or HIP, which PyTorch calls CUDA) call
// while a check records.
bool cuda_like(c10::DeviceType t) {
  return (t == c10::DeviceType::CUDA || t == c10::DeviceType::HIP) &&
         S->active.load(std::memory_order_relaxed) && !S->observe_only.load(std::memory_order_relaxed);
}

void gpu_event_record(c10::DeviceType t, uintptr_t event, uintptr_t stream) {
  if (cuda_like(t)) traced_host_op(HostOp::EventRecord, event, stream);
}
void gpu_event_wait(c10::DeviceType t, uintptr_t event, uintptr_t stream) {
  if (cuda_like(t)) traced_host_op(HostOp::EventWait, event, stream);
}
void gpu_event_sync(c10::DeviceType t, uintptr_t event) {
  if (cuda_like(t)) traced_host_op(HostOp::EventSync, event, 0);
}
void gpu_stream_sync(c10::DeviceType t, uintptr_t stream) {
  if (cuda_like(t)) traced_host_op(HostOp::StreamSync, 0, stream);
}
void gpu_device_sync(c10::DeviceType t) {
  if (cuda_like(t)) traced_host_op(HostOp::DeviceSync, 0, 0);
}

// A query through c10's CUDA guard that found `event` (or, `event` 0, `stream` of `device`)
// complete.
void traced_query(uint64_t event, uint64_t stream, c10::DeviceIndex device) {
  if (S == nullptr || !cuda_like(c10::DeviceType::CUDA)) return;
  traced_host_op(event != 0 ? HostOp::EventQuery : HostOp::StreamQuery, event, stream, device);
}

#ifdef STREAMSAN_GPU_TRACE
// The interpreter c10 calls for its GPU trace while a check runs: events, waits and
// synchronizations are recorded here, in C++ (torch's own interpreter calls Python for each
// allocation and free as well, traced or not); every call then goes on to the interpreter that
// was in place before (CSAN's callbacks, say), if any. Methods other than the trace's are never
// called through the GPU trace; they are torch's interpreter's.
struct TraceVTable final : c10::impl::PyInterpreterVTable {
  const c10::impl::PyInterpreter* prev = nullptr;

  static const c10::impl::PyInterpreterVTable& base() { return **getPyInterpreter(); }

  std::string name() const override { return base().name(); }
  void incref(PyObject* o) const override { base().incref(o); }
  void decref(PyObject* o) const override { base().decref(o); }
  bool try_incref(const c10::impl::PyObjectSlot& slot) const override { return base().try_incref(slot); }
  size_t refcnt(PyObject* o) const override { return base().refcnt(o); }
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl* self) const override {
    return base().detach(self);
  }
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override {
    base().dispatch(op, stack);
  }
  void reportErrorCallback(PyObject* callback, c10::DispatchKey key) const override {
    base().reportErrorCallback(callback, key);
  }
  void python_op_registration_trampoline(const c10::OperatorHandle& op, c10::DispatchKey key,
                                         c10::DispatchKeySet keyset, torch::jit::Stack* stack,
                                         bool with_keyset, bool with_op) const override {
    base().python_op_registration_trampoline(op, key, keyset, stack, with_keyset, with_op);
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                              const char* context) const override {
    base().throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
  }
  void python_dispatcher(const c10::OperatorHandle& op, c10::DispatchKeySet keyset,
                         torch::jit::Stack* stack) const override {
    base().python_dispatcher(op, keyset, stack);
  }
  bool is_contiguous(const c10::TensorImpl* self, at::MemoryFormat f) const override {
    return base().is_contiguous(self, f);
  }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl* self, at::MemoryFormat f) const override {
    return base().sym_is_contiguous(self, f);
  }
  bool is_strides_like(const c10::TensorImpl* self, at::MemoryFormat f) const override {
    return base().is_strides_like(self, f);
  }
  bool is_non_overlapping_and_dense(const c10::TensorImpl* self) const override {
    return base().is_non_overlapping_and_dense(self);
  }
  c10::Device device(const c10::TensorImpl* self) const override { return base().device(self); }
  int64_t dim(const c10::TensorImpl* self) const override { return base().dim(self); }
  c10::IntArrayRef strides(const c10::TensorImpl* self) const override { return base().strides(self); }
  c10::IntArrayRef sizes(const c10::TensorImpl* self) const override { return base().sizes(self); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl* self) const override { return base().sym_sizes(self); }
  c10::Layout layout(const c10::TensorImpl* self) const override { return base().layout(self); }
  int64_t numel(const c10::TensorImpl* self) const override { return base().numel(self); }
  c10::SymInt sym_numel(const c10::TensorImpl* self) const override { return base().sym_numel(self); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl* self) const override {
    return base().sym_strides(self);
  }
  c10::SymInt sym_storage_offset(const c10::TensorImpl* self) const override {
    return base().sym_storage_offset(self);
  }
  void reset_backward_hooks(const c10::TensorImpl* self) const override { base().reset_backward_hooks(self); }

  void trace_gpu_event_creation(c10::DeviceType t, uintptr_t event) const override {
    if (prev) (*prev)->trace_gpu_event_creation(t, event);
  }
  void trace_gpu_event_deletion(c10::DeviceType t, uintptr_t event) const override {
    if (prev) (*prev)->trace_gpu_event_deletion(t, event);
  }
  void trace_gpu_event_record(c10::DeviceType t, uintptr_t event, uintptr_t stream) const override {
    gpu_event_record(t, event, stream);
    if (prev) (*prev)->trace_gpu_event_record(t, event, stream);
  }
  void trace_gpu_event_wait(c10::DeviceType t, uintptr_t event, uintptr_t stream) const override {
    gpu_event_wait(t, event, stream);
    if (prev) (*prev)->trace_gpu_event_wait(t, event, stream);
  }
  void trace_gpu_memory_allocation(c10::DeviceType t, uintptr_t ptr) const override {
    if (prev) (*prev)->trace_gpu_memory_allocation(t, ptr);
  }
  void trace_gpu_memory_deallocation(c10::DeviceType t, uintptr_t ptr) const override {
    if (prev) (*prev)->trace_gpu_memory_deallocation(t, ptr);
  }
  void trace_gpu_stream_creation(c10::DeviceType t, uintptr_t stream) const override {
    if (prev) (*prev)->trace_gpu_stream_creation(t, stream);
  }
  void trace_gpu_device_synchronization(c10::DeviceType t) const override {
    gpu_device_sync(t);
    if (prev) (*prev)->trace_gpu_device_synchronization(t);
  }
  void trace_gpu_stream_synchronization(c10::DeviceType t, uintptr_t stream) const override {
    gpu_stream_sync(t, stream);
    if (prev) (*prev)->trace_gpu_stream_synchronization(t, stream);
  }
  void trace_gpu_event_synchronization(c10::DeviceType t, uintptr_t event) const override {
    gpu_event_sync(t, event);
    if (prev) (*prev)->trace_gpu_event_synchronization(t, event);
  }
};

// Never destroyed: a thread may still be calling them after the check.
TraceVTable* const trace_vtable = new TraceVTable();
c10::impl::PyInterpreter* const trace_interpreter = new c10::impl::PyInterpreter(trace_vtable);
#endif

struct TraceSlot {
  bool installed = false;
  const c10::impl::PyInterpreter* saved = nullptr;  // the GPU trace before ours
  bool saved_have = false;
} trace_slot;

// Puts the recorder's interpreter in c10's GPU trace for the check (what was there is called
// after it, and put back at the end: a program after the check pays nothing). False where this
// torch is not supported (Python's callbacks are used instead). GIL held.
bool install_gpu_trace() {
#ifdef STREAMSAN_GPU_TRACE
  using c10::impl::GPUTrace;
  if (trace_slot.installed) return true;
  trace_slot.saved = GPUTrace::gpuTraceState.load(std::memory_order_acquire);
  trace_slot.saved_have = GPUTrace::haveState;
  trace_vtable->prev = GPUTrace::get_trace();
  GPUTrace::gpuTraceState.store(trace_interpreter, std::memory_order_release);
  GPUTrace::haveState = true;
  trace_slot.installed = true;
  return true;
#else
  return false;
#endif
}

// Puts back the GPU trace that was there before the check. Returns false when another one had
// taken the recorder's place meanwhile (it is left there: the syncs after it were not seen).
bool uninstall_gpu_trace() {
#ifdef STREAMSAN_GPU_TRACE
  using c10::impl::GPUTrace;
  if (!trace_slot.installed) return true;
  trace_slot.installed = false;
  if (GPUTrace::gpuTraceState.load(std::memory_order_acquire) != trace_interpreter) return false;
  // Readers look at haveState first: it goes false before the pointer changes, true after.
  if (!trace_slot.saved_have) GPUTrace::haveState = false;
  GPUTrace::gpuTraceState.store(trace_slot.saved, std::memory_order_release);
  if (trace_slot.saved_have) GPUTrace::haveState = true;
  return true;
#else
  return true;
#endif
}

// Tests: whether c10's GPU trace is the recorder's now.
bool gpu_trace_is_ours() {
#ifdef STREAMSAN_GPU_TRACE
  return c10::impl::GPUTrace::gpuTraceState.load(std::memory_order_acquire) == trace_interpreter;
#else
  return false;
#endif
}

// Tests: calls c10's GPU trace as CUDA code does, through whatever interpreter is in place
// (`what`: record, wait, event_sync, stream_sync, device_sync). False when no trace is active.
bool fake_gpu_trace(const std::string& what, uint64_t event, uint64_t stream) {
  const c10::impl::PyInterpreter* interp = c10::impl::GPUTrace::get_trace();
  if (!interp) return false;
  auto t = c10::DeviceType::CUDA;
  if (what == "record") {
    (*interp)->trace_gpu_event_record(t, event, stream);
  } else if (what == "wait") {
    (*interp)->trace_gpu_event_wait(t, event, stream);
  } else if (what == "event_sync") {
    (*interp)->trace_gpu_event_synchronization(t, event);
  } else if (what == "stream_sync") {
    (*interp)->trace_gpu_stream_synchronization(t, stream);
  } else if (what == "device_sync") {
    (*interp)->trace_gpu_device_synchronization(t);
  } else if (what == "alloc") {
    (*interp)->trace_gpu_memory_allocation(t, event);
  } else {
    return false;
  }
  return true;
}

// Whether this build records syncs from the GPU trace itself.
bool native_syncs() {
#ifdef STREAMSAN_GPU_TRACE
  return true;
#else
  return false;
#endif
}

// Observing only times nothing: the clock's reads around each callback would be part of the cost
// it is there to measure (four a recorded op: 40 ns each on some hosts).
void set_profile(bool on, bool observe_only) {
  S->profiling.store(on && !observe_only);
  S->observe_only.store(observe_only);
}

// Seconds spent per recording stage, and counts, since the check began (profiling on).
py::dict profile() {
  py::dict d;
  auto sec = [](const std::atomic<uint64_t>& ns) { return static_cast<double>(ns.load()) * 1e-9; };
  d["ops"] = S->prof.ops.load();
  d["callbacks"] = S->prof.callbacks.load();
  d["batches"] = S->prof.batches.load();
  d["regions_seconds"] = sec(S->prof.regions);
  d["site_seconds"] = sec(S->prof.site);
  d["serialize_seconds"] = sec(S->prof.serialize);
  d["allocator_seconds"] = sec(S->prof.allocator);
  d["syncs_seconds"] = sec(S->prof.syncs);
  d["handover_seconds"] = sec(S->prof.handover);
  d["callbacks_seconds"] = sec(S->prof.callback_total);
  d["kernels_seconds"] = sec(S->prof.kernels);
  d["kernels_regions_seconds"] = sec(S->prof.kernels_regions);
  d["kernels_site_seconds"] = sec(S->prof.kernels_site);
  d["kernels_submit_seconds"] = sec(S->prof.kernels_submit);
  d["resolver_seconds"] = sec(S->prof.resolver);
  d["resolved"] = S->prof.resolved.load();
  d["deferred"] = S->prof.deferred.load();
  std::vector<std::pair<uint64_t, std::string>> unwritten;
  {
    StateLock g;
    for (const auto& kv : S->prof.unwritten) unwritten.emplace_back(kv.second, kv.first);
  }
  std::sort(unwritten.rbegin(), unwritten.rend());
  py::list top;
  for (size_t i = 0; i < unwritten.size() && i < 12; i++) {
    // The name is quoted (JSON): shown without its quotes.
    const std::string& q = unwritten[i].second;
    top.append(py::make_tuple(q.size() >= 2 ? q.substr(1, q.size() - 2) : q, unwritten[i].first));
  }
  d["unwritten_ops"] = top;
  return d;
}

// A declared host access of a tensor's memory (numpy views): `host_read`/`host_write` of its
// region when it is pinned memory the check knows. Returns whether it was written.
bool host_access(const at::Tensor& t, bool write) {
  Access a;
  if (!region_of(t, write, a) || a.device) return false;
  const std::string& site = *user_site();
  StateLock g;
  if (!resolve(a, site)) return false;
  std::string line = write ? "{\"op\":\"host_write\",\"buffer\":" : "{\"op\":\"host_read\",\"buffer\":";
  put_region(line, a);
  put_site(line, site);
  ThreadState& th = tls();
  if (!th.frames.empty()) {
    keep_callees(th, th.frames.size());
    th.frames.back().pending.push_back(std::move(line));
  } else {
    S->batch += line;
  }
  return true;
}

py::dict counters() {
  // Read under the locks, turned into Python objects after them (making them may run Python).
  uint64_t external, bad, pool_outside, triton, refused, device_bufs, pinned_bufs, kinds, retired;
  bool raw_sink;
  {
    StateLock g;
    external = S->external_accesses;
    bad = S->bad_regions;
    pool_outside = S->pool_allocations_outside_capture;
    triton = S->triton_launches;
    {
      std::lock_guard<std::mutex> r(S->raw_mu);
      raw_sink = S->raw_sink != nullptr;
      refused = S->raw_refused_bytes;
    }
    device_bufs = S->device_bufs.size();
    pinned_bufs = S->pinned_bufs.size();
    kinds = S->ops.size() + S->labels.size();
    retired = S->retired_ops.size();
  }
  py::dict d;
  d["external_accesses"] = external;
  d["foreign_threads"] = S->foreign_threads.load();
  d["frames_without_gil"] = S->fast_frames.load();
  d["sites_without_gil"] = S->fast_sites.load();
  d["sites_with_gil"] = S->slow_sites.load();
  d["bad_regions"] = bad;
  d["pool_allocations_outside_capture"] = pool_outside;
  d["triton_launches"] = triton;
  d["raw_sink"] = raw_sink;
  d["raw_refused_bytes"] = refused;
  d["live_device_buffers"] = device_bufs;
  d["live_pinned_buffers"] = pinned_bufs;
  // Earlier checks' buffers handed to the resolver to free (this process), and not freed yet.
  d["leftovers_handed"] = S->leftovers_handed.load();
  d["leftovers_unfreed"] = S->leftovers_unfreed.load();
  d["op_kinds"] = kinds;
  d["op_kinds_retired"] = retired;
  d["tracker"] = S->tracker_attached;
  d["guard_spy"] = S->guard_spy;
  d["deferring"] = S->defer.load();
  d["queue_caught_up"] = S->prof.caught_up.load();
  d["quiet_ops"] = S->prof.quieted.load();
  d["resolver_errors"] = S->resolver_errors.load();
  return d;
}

// A check's recorder made in one call, what `configure`, `reset`, `set_stdlib_dir` and
// `set_internal` do one by one. GIL held.
void open_check(const std::string& torch_dir, const std::string& own_dir, const std::string& cwd,
                size_t threshold, py::object sink, bool fake_device, py::object pinned_example,
                const std::string& stdlib_dir, const std::vector<std::string>& libraries,
                const std::vector<std::string>& internal_dirs, py::object rewritten) {
  configure(torch_dir, own_dir, cwd, threshold, std::move(sink), fake_device, std::move(pinned_example));
  reset();
  release_held();  // what a check that ended during a CUDA graph capture still held (see release_held)
  set_stdlib_dir(stdlib_dir, libraries);
  set_internal(internal_dirs, std::move(rewritten));
}

// A check's recording started in one call, what `check_frames`, `install`, `set_profile`,
// `install_gpu_trace`, `set_defer`, `set_quiet_callees`, `set_raw_sink` and `set_active` do one by
// one (a check's start pays one crossing into C++, not eight). `profile`: 0 nothing timed, 1 the
// stages timed, 2 observing only. `gpu_trace`: the recorder's interpreter put in c10's GPU trace.
// `raw_sink`: the checker's capsule, or None (Python's sink). `pinned_at_once`: records of ops on
// pinned memory written at once (STREAMSAN_PINNED=at-once). Returns false when `raw_sink` is not
// a raw sink (Python's sink takes the batches). GIL held.
bool begin_recording(bool with_cuda, int profile, bool gpu_trace, bool defer, bool defer_fake, bool quiet,
                     py::object raw_sink, bool pinned_at_once) {
  check_frames();
  install(with_cuda);
  set_profile(profile == 1, profile == 2);
  if (gpu_trace) install_gpu_trace();
  S->guard_spy = (with_cuda || S->fake_device) && install_guard_spy();
  set_defer(defer, defer_fake);
  S->quiet_callees.store(quiet);
  S->pinned_at_once.store(pinned_at_once);
  read_unreadable_knob();
  const bool taken = raw_sink.is_none() || set_raw_sink(raw_sink);
  set_active(true);
  return taken;
}

// A check's recording ended in one call, what `set_active(False)`, `flush_to_sink` (with `flush`),
// `set_raw_sink(None)`, `uninstall_gpu_trace` (with `gpu_trace`), `set_profile`, `uninstall` and
// `release_sink` do one by one. Returns whether the GPU trace was still the recorder's (see
// uninstall_gpu_trace), and the counts a check's end warns about: records the resolver could not
// write (out of memory) and accesses to memory allocated before the check. GIL held; released
// while what is queued is written.
py::tuple end_recording(bool flush, bool gpu_trace) {
  set_active(false);
  if (flush) flush_to_sink();
  set_raw_sink(py::none());
  const bool ours = gpu_trace ? uninstall_gpu_trace() : true;
  uninstall_guard_spy();
  set_profile(false, false);
  uninstall();
  release_sink();
  uint64_t external = 0;
  {
    StateLock g;
    external = S->external_accesses;
  }
  std::string first;
  {
    std::lock_guard<std::mutex> g(S->callback_error_mu);
    first = S->first_callback_error;
  }
  return py::make_tuple(ours, S->resolver_errors.load(), external, S->callback_errors.load(), first);
}

}  // namespace

// The digest of this source that _native.py passed to the build (its source_digest()): a
// module given by STREAMSAN_TORCH_EXT is used only when it is this version's.
#ifndef STREAMSAN_SOURCE
#define STREAMSAN_SOURCE unknown
#endif
#define STREAMSAN_STRING2(x) #x
#define STREAMSAN_STRING(x) STREAMSAN_STRING2(x)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "streamsan.torch's fast recorder (RecordFunction observer + allocator tracker)";
  m.attr("source_digest") = STREAMSAN_STRING(STREAMSAN_SOURCE);
  m.def("install", &install, py::arg("with_cuda"));
  m.def("uninstall", &uninstall);
  m.def("bench_floor", &bench_floor, py::arg("on"), py::arg("io") = true);
  m.def("bench_floor_on", &bench_floor_on);
  m.def("bench_ablate", &bench_ablate, py::arg("mask"));
  m.def("mark_used_on_stream", &mark_used_on_stream, py::arg("tensor"), py::arg("stream_id"));
  m.def("bench_micro", &bench_micro, py::arg("n"));
  m.def("check_frames", &check_frames);
  m.def("configure", &configure);
  m.def("set_active", &set_active);
  m.def("set_stdlib_dir", &set_stdlib_dir);
  m.def("set_internal", &set_internal);
  m.def("reset", &reset);
  m.def("drain", &drain);
  m.def("flush_to_sink", &flush_to_sink);
  m.def("name_stream", &name_stream);
  m.def("stream_id", &stream_id);
  m.def("set_fake_stream", &set_fake_stream);
  m.def("fake_pin", &fake_pin);
  m.def("fake_trace", &fake_trace, py::arg("alloc"), py::arg("addr"), py::arg("size"), py::arg("stream"),
        py::arg("pool") = std::pair<int64_t, int64_t>{0, 0});
  m.def("set_pool_name", &set_pool_name);
  m.def("pool_name", &pool_name);
  m.def("record_kernel", &record_kernel);
  m.def("record_triton", &record_triton);
  m.def("fast_plan_put", &fast_plan_put);
  m.def("fast_plans_clear", &fast_plans_clear);
  m.def("fast_depth", &fast_depth);
  m.def("frame_depth", [] { return tls().frames.size(); });  // tests: this thread's open ops
  m.def("fast_plans_count", &fast_plans_count);
  fast_plan_gone_fn = PyCFunction_New(&fast_plan_gone_def, nullptr);
  fast_run_stream_name = PyUnicode_InternFromString("stream");
  fast_run_launchers_name = PyUnicode_InternFromString("launchers");
  if (fast_plan_gone_fn == nullptr || fast_run_stream_name == nullptr || fast_run_launchers_name == nullptr ||
      PyType_Ready(&FastRunType) < 0)
    throw py::error_already_set();
  m.add_object("FastRun", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&FastRunType)));
  m.def("host_op", &host_op);
  m.def("host_access", &host_access);
  m.def("counters", &counters);
  m.def("install_gpu_trace", &install_gpu_trace);
  m.def("set_quiet_callees", [](bool on) { S->quiet_callees.store(on); });
  m.def("uninstall_gpu_trace", &uninstall_gpu_trace);
  m.def("fake_gpu_trace", &fake_gpu_trace);
  m.def("gpu_trace_is_ours", &gpu_trace_is_ours);
  m.def("native_syncs", &native_syncs);
  m.def("set_profile", &set_profile, py::arg("on"), py::arg("observe_only") = false);
  m.def("set_raw_sink", &set_raw_sink);
  m.def("open_check", &open_check);
  m.def("begin_recording", &begin_recording, py::arg("with_cuda"), py::arg("profile"), py::arg("gpu_trace"),
        py::arg("defer"), py::arg("defer_fake"), py::arg("quiet"), py::arg("raw_sink"),
        py::arg("pinned_at_once") = false);
  m.def("end_recording", &end_recording, py::arg("flush"), py::arg("gpu_trace"));
  m.def("set_defer", &set_defer, py::arg("on"), py::arg("fake_device") = false);
  m.def("release_sink", &release_sink);
  m.def("profile", &profile);
  m.def("set_captures", &set_captures);
}
