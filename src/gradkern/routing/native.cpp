// gradkern's native router: a C++ kernel registered over the Python router of an ATen overload, which replays what
// the Python router did for a descriptor (its allocations, views, fills and Triton launches) without entering
// Python. The Python side (native.py) records a descriptor's program and commits it here; this file only keys,
// stores and replays programs. Every descriptor without a program goes to the Python router, as it would without
// this file.
#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/empty_strided_native.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------------ the driver
using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using ParamInfo = CUresult (*)(CUfunction, size_t, size_t*, size_t*);

void* driver_symbol(const char* name) {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
  TORCH_CHECK(lib != nullptr, "gradkern native: libcuda.so.1 is not loaded");
  void* sym = dlsym(lib, name);
  TORCH_CHECK(sym != nullptr, "gradkern native: libcuda has no ", name);
  return sym;
}

// ------------------------------------------------------------------------------------------------ programs
// A program is a list of int64 words, as native.py encodes it. Slots are tensors: the call's tensor arguments in
// schema order, then each tensor an instruction makes, in order.
enum Op : int64_t {
  EMPTY = 1,   // fill, dtype, ndim, sizes..., strides...          -> a new slot (on the call's device)
  VIEW = 2,    // base slot, ndim, sizes..., strides..., offset from the base's storage offset -> a new slot
  ZERO = 3,    // slot
  FILL = 4,    // slot, bits of a double
  COPY = 5,    // destination slot, source slot
  LAUNCH = 6,  // function, grid x y z, threads, shared bytes, pdl, n, then n params (kind, a, b)
  RETURN = 7,  // n, slots...
  CUMSUM = 8,  // source slot, dim                                  -> a new slot (ATen's cumsum: int64 for integers)
};
enum Fill : int64_t { AS_EMPTY = 0, NEVER = 1, ZEROS = 2, VALUE = 3 };  // (VALUE: the double's bits follow)
enum Param : int64_t { SLOT_PTR = 0, CONST_PTR = 1, IMMEDIATE = 2 };   // (a, b): (slot, byte offset), (const,
                                                                       // byte offset), (value, bytes)

struct Launch {
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  bool pdl;
  std::vector<size_t> offsets;  // each param's byte offset in `buffer`
  std::vector<int64_t> kinds, as, bs;
  size_t bytes;
};

enum Kind : int64_t { PYTHON = 0, STOCK = 1, REPLAY = 2 };

struct Program {
  Kind kind = PYTHON;
  std::vector<int64_t> words;
  std::vector<Launch> launches;  // decoded LAUNCH instructions, in order
  std::vector<at::Tensor> consts;  // tensors a launch reads that the call did not make (tables a plan keeps)
  int device = -1;
};

double as_double(int64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Decodes the LAUNCH instructions and checks each against the kernel's parameters (count and sizes, from the
// driver): a program whose launch would not match the kernel is refused, so it stays with the Python router.
bool decode(Program& p) {
  static auto param_info = reinterpret_cast<ParamInfo>(driver_symbol("cuFuncGetParamInfo"));
  const auto& w = p.words;
  size_t i = 0;
  while (i < w.size()) {
    switch (w[i]) {
      case EMPTY: {
        int64_t nd = w[i + 3];
        i += 4 + 2 * nd + (w[i + 1] == VALUE ? 1 : 0);
        break;
      }
      case VIEW: i += 3 + 2 * w[i + 2] + 1; break;
      case ZERO: i += 2; break;
      case FILL: i += 3; break;
      case COPY: i += 3; break;
      case CUMSUM: i += 3; break;
      case LAUNCH: {
        Launch l;
        l.function = reinterpret_cast<CUfunction>(w[i + 1]);
        for (int d = 0; d < 3; ++d) l.grid[d] = static_cast<unsigned>(w[i + 2 + d]);
        l.threads = static_cast<unsigned>(w[i + 5]);
        l.shared = static_cast<unsigned>(w[i + 6]);
        l.pdl = w[i + 7] != 0;
        int64_t n = w[i + 8];
        size_t at = 0;
        size_t k = 0;
        for (;; ++k) {
          size_t off = 0, size = 0;
          if (param_info(l.function, k, &off, &size) != CUDA_SUCCESS) break;
          if (static_cast<int64_t>(k) < n) {
            int64_t kind = w[i + 9 + 3 * k], a = w[i + 10 + 3 * k], b = w[i + 11 + 3 * k];
            size_t want = kind == IMMEDIATE ? static_cast<size_t>(b) : 8;
            if (size != want) return false;
            l.kinds.push_back(kind);
            l.as.push_back(a);
            l.bs.push_back(b);
          } else {  // Triton's trailing scratch pointers: null (native.py refuses kernels that use scratch)
            if (size != 8) return false;
            l.kinds.push_back(IMMEDIATE);
            l.as.push_back(0);
            l.bs.push_back(8);
          }
          at = (at + size - 1) / size * size;
          l.offsets.push_back(at);
          at += size;
        }
        if (static_cast<int64_t>(k) < n || k > static_cast<size_t>(n) + 2) return false;
        l.bytes = at;
        p.launches.push_back(std::move(l));
        i += 9 + 3 * n;
        break;
      }
      case RETURN: i += 2 + w[i + 1]; break;
      default: return false;
    }
  }
  return i == w.size();
}

// ------------------------------------------------------------------------------------------------ state
std::atomic<bool> g_enabled{false};
std::atomic<bool> g_always{false};
thread_local int t_depth = 0;  // >0 while this thread runs a Python router (nested calls go to it, unreplayed)

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Entry {
  c10::OperatorHandle op;
  std::optional<c10::SafeKernelFunction> stock;   // ATen's kernel, captured before gradkern's routers
  std::optional<c10::SafeKernelFunction> python;  // gradkern's Python router
  std::optional<c10::OperatorHandle> recorder;    // the op that runs the Python router and records a program
  std::shared_mutex mutex;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Program>, KeyHash> programs;
  std::unordered_set<std::vector<int64_t>, KeyHash> seen;  // descriptors called once (the next call records)
  bool always = false;  // a gradkern.ops op: gradkern's whatever the switch and the mode (no stock route)
  explicit Entry(c10::OperatorHandle h) : op(std::move(h)) {}
};

// descriptors an op keeps programs for before it starts over (as the Python plan caches' CACHE_LIMIT)
constexpr size_t kMaxPrograms = 4096;

std::mutex g_entries_mutex;
std::unordered_map<std::string, std::unique_ptr<Entry>> g_entries;  // "aten::name.overload" -> its entry
// "namespace/dispatch key" -> the library holding gradkern's C++ kernels for it
std::unordered_map<std::string, std::unique_ptr<torch::Library>> g_libraries;

struct Pending {
  Entry* entry = nullptr;
  std::vector<int64_t> key;
  int device = -1;
};
thread_local Pending t_pending;  // the descriptor the recorder now running on this thread commits for

// ------------------------------------------------------------------------------------------------ keys
// The descriptor of a call: every argument (a tensor's dtype, device, sizes, strides, 16-byte alignment and the
// earlier argument it shares storage with; a scalar's type and bits) and the global switches a program depends on.
// False where an argument is of a kind not keyed (the Python router serves the call).
bool make_key(const torch::jit::Stack& stack, size_t n, bool always, std::vector<int64_t>& key, int& device) {
  const auto& ctx = at::globalContext();
  key.push_back(always ? 2 : g_always.load(std::memory_order_relaxed));
  key.push_back(ctx.deterministicAlgorithms() * 4 + ctx.deterministicAlgorithmsWarnOnly() * 2 +
                ctx.deterministicFillUninitializedMemory());
  std::vector<const void*> storages;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        key.push_back(-1);
        continue;
      }
      if (t.layout() != c10::kStrided || !t.is_cuda() || t.is_neg() || t.is_conj()) return false;
      int d = t.device().index();
      if (device < 0) device = d;
      if (d != device) return false;
      key.push_back(static_cast<int64_t>(t.scalar_type()) + 16 * d);
      key.push_back(t.dim());
      for (auto s : t.sizes()) key.push_back(s);
      for (auto s : t.strides()) key.push_back(s);
      key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
      const void* storage = t.storage().data();
      int64_t shared = -1;
      for (size_t j = 0; j < storages.size(); ++j)
        if (storages[j] == storage) shared = static_cast<int64_t>(j);
      key.push_back(shared);
      storages.push_back(storage);
    } else if (v.isDouble()) {
      key.push_back(-2);
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(bits);
    } else if (v.isInt()) {
      key.push_back(-3);
      key.push_back(v.toInt());
    } else if (v.isBool()) {
      key.push_back(-4);
      key.push_back(v.toBool());
    } else if (v.isNone()) {
      key.push_back(-5);
    } else if (v.isIntList()) {
      key.push_back(-6);
      auto l = v.toIntList();
      key.push_back(l.size());
      for (int64_t x : l) key.push_back(x);
    } else if (v.isString()) {
      key.push_back(-7);
      const auto& s = v.toStringRef();
      key.push_back(s.size());
      for (char c : s) key.push_back(c);
    } else {
      return false;
    }
  }
  return device >= 0;
}

// ------------------------------------------------------------------------------------------------ replay
// (slots and consts are read with at(): a program that names one it does not have raises instead of reading past)
void replay(const Program& p, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n_args = op.schema().arguments().size();
  std::vector<at::Tensor> slots;
  slots.reserve(8);
  for (size_t i = stack->size() - n_args; i < stack->size(); ++i)
    if ((*stack)[i].isTensor() && (*stack)[i].toTensor().defined()) slots.push_back((*stack)[i].toTensor());
  const auto device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(p.device));
  const auto& w = p.words;
  size_t i = 0, launch = 0;
  std::vector<at::Tensor> results;
  alignas(16) char buffer[1024];
  static auto launch_ex = reinterpret_cast<LaunchEx>(driver_symbol("cuLaunchKernelEx"));
  while (i < w.size()) {
    switch (w[i]) {
      case EMPTY: {
        int64_t fill = w[i + 1], nd = w[i + 3];
        auto dtype = static_cast<c10::ScalarType>(w[i + 2]);
        c10::IntArrayRef sizes(&w[i + 4], nd), strides(&w[i + 4 + nd], nd);
        at::Tensor t = fill == NEVER ? at::Tensor(at::detail::empty_strided_cuda(sizes, strides, dtype, device))
                                     : at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(device));
        if (fill == ZEROS) t.zero_();
        if (fill == VALUE) t.fill_(as_double(w[i + 4 + 2 * nd]));
        slots.push_back(std::move(t));
        i += 4 + 2 * nd + (fill == VALUE ? 1 : 0);
        break;
      }
      case VIEW: {  // (the offset is relative to the base's: an input's differs between calls of a descriptor)
        int64_t nd = w[i + 2];
        const at::Tensor& base = slots.at(w[i + 1]);
        slots.push_back(at::as_strided(base, c10::IntArrayRef(&w[i + 3], nd), c10::IntArrayRef(&w[i + 3 + nd], nd),
                                       base.storage_offset() + w[i + 3 + 2 * nd]));
        i += 4 + 2 * nd;
        break;
      }
      case ZERO: slots.at(w[i + 1]).zero_(); i += 2; break;
      case FILL: slots.at(w[i + 1]).fill_(as_double(w[i + 2])); i += 3; break;
      case COPY: slots.at(w[i + 1]).copy_(slots.at(w[i + 2])); i += 3; break;
      case CUMSUM: slots.push_back(at::cumsum(slots.at(w[i + 1]), w[i + 2])); i += 3; break;
      case LAUNCH: {
        const Launch& l = p.launches[launch++];
        void* params[64];
        TORCH_CHECK(l.bytes <= sizeof buffer && l.offsets.size() <= 64, "gradkern native: too many parameters");
        for (size_t k = 0; k < l.offsets.size(); ++k) {
          char* at = buffer + l.offsets[k];
          int64_t value = l.as[k];
          size_t size = 8;
          if (l.kinds[k] == SLOT_PTR) {
            value = reinterpret_cast<int64_t>(slots.at(l.as[k]).data_ptr()) + l.bs[k];
          } else if (l.kinds[k] == CONST_PTR) {
            value = reinterpret_cast<int64_t>(p.consts.at(l.as[k]).data_ptr()) + l.bs[k];
          } else {
            size = static_cast<size_t>(l.bs[k]);
          }
          std::memcpy(at, &value, size);  // (little-endian: the low bytes of the value)
          params[k] = at;
        }
        i += 9 + 3 * w[i + 8];
        if (static_cast<uint64_t>(l.grid[0]) * l.grid[1] * l.grid[2] == 0) break;
        CUlaunchAttribute attrs[1];
        CUlaunchConfig config{};
        config.gridDimX = l.grid[0];
        config.gridDimY = l.grid[1];
        config.gridDimZ = l.grid[2];
        config.blockDimX = l.threads;
        config.blockDimY = 1;
        config.blockDimZ = 1;
        config.sharedMemBytes = l.shared;
        config.hStream = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(p.device)).stream());
        config.numAttrs = 0;
        config.attrs = attrs;
        if (l.pdl) {
          attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
          attrs[0].value.programmaticStreamSerializationAllowed = 1;
          config.numAttrs = 1;
        }
        CUresult r = launch_ex(&config, l.function, params, nullptr);
        TORCH_CHECK(r == CUDA_SUCCESS, "gradkern native: cuLaunchKernelEx failed with CUresult ", static_cast<int>(r));
        break;
      }
      case RETURN: {
        for (int64_t k = 0; k < w[i + 1]; ++k) results.push_back(slots.at(w[i + 2 + k]));
        i += 2 + w[i + 1];
        break;
      }
    }
  }
  torch::jit::drop(*stack, n_args);
  for (auto& t : results) stack->emplace_back(std::move(t));
}

// ------------------------------------------------------------------------------------------------ the router
struct DepthGuard {  // while gradkern's Python runs on this thread (nested routed calls go to Python too)
  DepthGuard() { ++t_depth; }
  ~DepthGuard() { --t_depth; }
};

// a router's fallback: the Python router (or override) it sits over, with the thread's depth raised
template <class E>
void call_python(const E* entry, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  DepthGuard depth;
  entry->python->callBoxed(op, ks, stack);
}

c10::DispatchKeySet backend_keys() { return c10::DispatchKeySet(c10::DispatchKey::CUDA); }

struct Router final : c10::OperatorKernel {
  Entry* entry;
  explicit Router(Entry* e) : entry(e) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if ((!entry->always && !g_enabled.load(std::memory_order_relaxed)) || t_depth > 0)
      return call_python(entry, op, ks, stack);
    std::vector<int64_t> key;
    key.reserve(48);
    int device = -1;
    if (!make_key(*stack, op.schema().arguments().size(), entry->always, key, device))
      return call_python(entry, op, ks, stack);
    std::shared_ptr<const Program> program;
    bool record = false;
    {
      std::shared_lock<std::shared_mutex> lock(entry->mutex);
      auto it = entry->programs.find(key);
      if (it != entry->programs.end()) program = it->second;
      else record = entry->seen.count(key) > 0;
    }
    if (program) {
      if (program->kind == STOCK) return entry->stock->callBoxed(op, backend_keys(), stack);
      if (program->kind == REPLAY && c10::cuda::current_device() == program->device) return replay(*program, op, stack);
      return call_python(entry, op, ks, stack);
    }
    if (!record || !entry->recorder) {  // a descriptor's first call warms the Python router's own caches
      {
        std::unique_lock<std::shared_mutex> lock(entry->mutex);
        if (entry->seen.size() >= kMaxPrograms) entry->seen.clear();
        entry->seen.insert(key);
      }
      return call_python(entry, op, ks, stack);
    }
    t_pending = Pending{entry, std::move(key), device};
    DepthGuard depth;
    try {
      entry->recorder->callBoxed(stack);
    } catch (...) {
      t_pending = Pending{};
      throw;
    }
    t_pending = Pending{};
  }
};

// ------------------------------------------------------------------------------------------------ the NaN fill
// In deterministic mode ATen's CUDA `empty` and `empty_strided` fill what they allocate with NaN
// (`fill_uninitialized_memory`), a kernel launch each. Inside a stock op that writes everything it allocates before
// reading it (`attach_whole_write`), the fill changes no bit of any result: while gradkern is enabled those
// allocations skip it, as gradkern's own outputs do (launch/alloc.py). Every other allocation is ATen's, filled.
thread_local bool t_whole_write = false;  // this thread runs a whole-write op's stock kernel

bool fills() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

struct WholeWrite final : c10::OperatorKernel {
  Entry* entry;
  explicit WholeWrite(Entry* e) : entry(e) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (t_whole_write || !g_enabled.load(std::memory_order_relaxed) || !fills())
      return entry->stock->callBoxed(op, backend_keys(), stack);
    t_whole_write = true;
    struct Reset {
      ~Reset() { t_whole_write = false; }
    } reset;
    entry->stock->callBoxed(op, backend_keys(), stack);
  }
};

// ATen's CUDA kernels of empty.memory_format and empty_strided (at::native's, as its registration calls them), less
// the fill inside a whole-write op
at::Tensor empty_over(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory,
                      std::optional<at::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (t_whole_write) return at::detail::empty_cuda(sizes, dtype, layout, device, pin_memory, memory_format);
  return at::native::empty_cuda(sizes, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor empty_strided_over(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, std::optional<at::ScalarType> dtype,
                              std::optional<at::Layout> layout, std::optional<at::Device> device,
                              std::optional<bool> pin_memory) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size), strides = C10_AS_INTARRAYREF_SLOW(stride);
  if (t_whole_write) return at::detail::empty_strided_cuda(sizes, strides, dtype, layout, device, pin_memory);
  return at::native::empty_strided_cuda(sizes, strides, dtype, layout, device, pin_memory);
}

// ------------------------------------------------------------------------------------------------ autograd
// The C++ router of an autograd-key override (routing/autograd.py's fused_autograd: where.self, lerp, _prelu_kernel,
// repeat):
// for a plain call (grad mode on, an input requiring grad, every tensor a plain strided CUDA tensor, no dispatch mode,
// functorch transform or forward-mode tangent) whose descriptor the Python side accepted, it runs stock's forward
// below autograd and puts a C++ node in the graph, whose backward calls the op's fused twin (gradkern_ag::..., replayed
// by the native router) or, to differentiate the backward itself or for a gradient that is not a plain tensor, its
// composite twin (the ATen formula). A descriptor's first plain call asks the Python planner for its plan; every
// call the plan or these checks do not take goes to the Python override.
struct AgPlan {
  bool fast = false;
  std::vector<int64_t> save;  // the arguments (schema positions) the backward reads, in the twins' order
  std::vector<int64_t> outs;  // for each twin output, the tensor argument (its position among them) it is for
  int64_t desc = 0;           // the twins' last argument: the descriptor's attributes on the Python side
  std::optional<c10::OperatorHandle> fused, composite;
  std::string name;
};

struct AgEntry {
  c10::OperatorHandle op;
  std::optional<c10::SafeKernelFunction> python;  // gradkern's Python router on the autograd key
  std::optional<c10::OperatorHandle> planner;     // gradkern_ag::<overload>__plan: Python, commits a descriptor's plan
  std::shared_mutex mutex;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const AgPlan>, KeyHash> plans;
  explicit AgEntry(c10::OperatorHandle h) : op(std::move(h)) {}
};

std::unordered_map<std::string, std::unique_ptr<AgEntry>> g_ag_entries;  // (under g_entries_mutex)
std::vector<std::unique_ptr<AgEntry>> g_ag_retired;

struct AgPending {
  AgEntry* entry = nullptr;
  std::vector<int64_t> key;
};
thread_local AgPending t_ag_pending;

// A tensor the fused path takes as it is: dense, strided, on CUDA, without a functionality that changes what its
// storage means (negative / conjugate bits, zero tensor) or wraps it (Python subclass, functorch, functionalization).
bool plain_tensor(const at::Tensor& t) {
  if (!t.is_cuda() || t.layout() != c10::kStrided || t.is_nested() || t.is_neg() || t.is_conj() || t._is_zerotensor())
    return false;
  const auto ks = t.key_set();
  for (auto k : {c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                 c10::DispatchKey::Functionalize, c10::DispatchKey::BatchedNestedTensor})
    if (ks.has(k)) return false;
  return !t._fw_grad(/*level=*/0).defined();
}

// How an autograd router takes a call. PYTHON: a tensor that is not plain, a torch-dispatch mode or functorch (the
// Python override decides); BELOW: no graph wanted (grad mode off, or no argument requiring grad), so stock's forward
// below autograd, as stock's autograd kernel would run it, without entering Python (where and lerp are registered in
// mode "auto": their no-grad calls are most calls); GRAPH: the fast path, where the descriptor's plan allows it.
// `needs`: which arguments require grad, by schema position.
enum class AgCall { PYTHON, BELOW, GRAPH };

AgCall ag_classify(const torch::jit::Stack& stack, size_t n, std::vector<int64_t>& needs) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    return AgCall::PYTHON;
  const bool grad_mode = at::GradMode::is_enabled();
  bool any = false;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    bool rg = false;
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      if (!plain_tensor(t)) return AgCall::PYTHON;
      rg = grad_mode && t.requires_grad();
    }
    needs.push_back(rg);
    any = any || rg;
  }
  return any ? AgCall::GRAPH : AgCall::BELOW;
}

using NodeRef = decltype(torch::autograd::Edge::function);  // (a shared_ptr or, in newer torch, an intrusive_ptr)

template <class T>
NodeRef make_node() {
  if constexpr (std::is_same_v<NodeRef, std::shared_ptr<torch::autograd::Node>>) return std::make_shared<T>();
  else return c10::make_intrusive<T>();
}

struct FusedNode final : torch::autograd::Node {
  std::shared_ptr<const AgPlan> plan;
  std::vector<torch::autograd::SavedVariable> saved;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(num_outputs());
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    torch::jit::Stack stack;
    stack.reserve(saved.size() + 2);
    stack.emplace_back(grad);
    for (const auto& s : saved) stack.emplace_back(s.unpack());
    stack.emplace_back(plan->desc);
    // create_graph (the gradient must itself be differentiable) or a gradient the kernels cannot read as plain
    // storage: the ATen formula
    bool composite = at::GradMode::is_enabled() || !plain_tensor(grad);
    (composite ? plan->composite : plan->fused)->callBoxed(&stack);
    TORCH_CHECK(stack.size() == plan->outs.size(), "gradkern native: the backward twin of ", plan->name,
                " returned ", stack.size(), " results for ", plan->outs.size());
    for (size_t k = 0; k < plan->outs.size(); ++k) result.at(plan->outs[k]) = stack[k].toTensor();
    return result;
  }
  void release_variables() override {
    for (auto& s : saved) s.reset_data();
  }
  std::string name() const override { return plan->name; }
};

struct AgRouter final : c10::OperatorKernel {
  AgEntry* entry;
  explicit AgRouter(AgEntry* e) : entry(e) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (!g_enabled.load(std::memory_order_relaxed) || t_depth > 0) return call_python(entry, op, ks, stack);
    const size_t n = op.schema().arguments().size();
    std::vector<int64_t> needs;
    switch (ag_classify(*stack, n, needs)) {
      case AgCall::PYTHON:
        return call_python(entry, op, ks, stack);
      case AgCall::BELOW: {
        at::AutoDispatchBelowADInplaceOrView guard;
        return op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      }
      case AgCall::GRAPH:
        break;
    }
    std::vector<int64_t> key;  // (reserved only here: the calls above, disabled or no-grad ones, allocate none)
    key.reserve(48);
    int device = -1;
    if (!make_key(*stack, n, false, key, device)) return call_python(entry, op, ks, stack);
    key.insert(key.end(), needs.begin(), needs.end());
    auto find_plan = [&]() -> std::shared_ptr<const AgPlan> {
      std::shared_lock<std::shared_mutex> lock(entry->mutex);
      auto it = entry->plans.find(key);
      return it != entry->plans.end() ? it->second : nullptr;
    };
    std::shared_ptr<const AgPlan> plan = find_plan();
    if (!plan) {  // the Python side decides (and defines the twins) once per descriptor
      torch::jit::Stack args(stack->end() - n, stack->end());
      t_ag_pending = AgPending{entry, key};
      try {
        entry->planner->callBoxed(&args);
      } catch (...) {
        t_ag_pending = AgPending{};
        throw;
      }
      t_ag_pending = AgPending{};
      plan = find_plan();
    }
    if (!plan || !plan->fast) return call_python(entry, op, ks, stack);

    std::vector<at::Tensor> inputs;  // the tensor arguments, in order: the node's next edges
    auto node_ref = make_node<FusedNode>();
    auto* node = static_cast<FusedNode*>(node_ref.get());
    node->plan = plan;
    for (size_t i = stack->size() - n; i < stack->size(); ++i)
      if ((*stack)[i].isTensor()) inputs.push_back((*stack)[i].toTensor());
    for (int64_t i : plan->save)
      node->saved.emplace_back((*stack)[stack->size() - n + i].toTensor(), /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(inputs));
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    }
    torch::autograd::set_history(stack->back().toTensor(), node_ref);
  }
};

// Stores the plan the planner running on this thread found for its descriptor. `fast` false: the Python override.
void ag_commit(bool fast, std::vector<int64_t> save, std::vector<int64_t> outs, int64_t desc, std::string fused,
               std::string composite, std::string name);

// The operator "ns::name" or "ns::name.overload" ("default" is the unnamed overload).
c10::OperatorHandle find_op(const std::string& qualname) {
  auto dot = qualname.find('.');
  std::string name = qualname.substr(0, dot), overload = dot == std::string::npos ? "" : qualname.substr(dot + 1);
  if (overload == "default") overload = "";
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

Entry& entry_of(const std::string& qualname) {
  std::lock_guard<std::mutex> lock(g_entries_mutex);
  auto it = g_entries.find(qualname);
  if (it != g_entries.end()) return *it->second;
  auto& e = g_entries[qualname];
  e = std::make_unique<Entry>(find_op(qualname));
  return *e;
}

// ------------------------------------------------------------------------------------------------ the ops
void capture_stock(std::string qualname) {
  Entry& e = entry_of(qualname);
  if (!e.stock) e.stock = e.op.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA);
}

// Registers `router` as the kernel of `qualname` ("ns::op" or "ns::op.overload") for `key`, in the process-lifetime
// library of that namespace and key.
torch::Library& library_of(const std::string& ns, c10::DispatchKey key) {
  auto& library = g_libraries[ns + "/" + c10::toString(key)];
  if (!library) library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return *library;
}

template <class R>
void impl_over(const std::string& qualname, c10::DispatchKey key, std::unique_ptr<R> router) {
  auto& library = library_of(qualname.substr(0, qualname.find("::")), key);
  auto name = qualname.substr(qualname.find("::") + 2);
  if (name.size() > 8 && name.compare(name.size() - 8, 8, ".default") == 0) name.resize(name.size() - 8);
  library.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(router)));
}

// Registers the router over the CUDA kernel `qualname` now has (gradkern's Python). `always`: a gradkern.ops op,
// gradkern's whatever the switch (an ATen op needs its stock kernel captured first).
void attach(std::string qualname, std::string recorder, bool always) {
  Entry& e = entry_of(qualname);
  e.always = always;
  TORCH_CHECK(always || e.stock, "gradkern native: ATen's kernel for ", qualname, " was not captured");
  e.python = e.op.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA);
  e.recorder = find_op(recorder);
  impl_over(qualname, c10::DispatchKey::CUDA, std::make_unique<Router>(&e));
}

// Registers the whole-write wrapper over the CUDA kernel of each of `qualnames` (stock ops that write everything
// they allocate before reading it), and the CUDA `empty` kernels that skip the fill inside them.
void attach_whole_write(std::vector<std::string> qualnames) {
  for (const auto& q : qualnames) {
    capture_stock(q);
    impl_over(q, c10::DispatchKey::CUDA, std::make_unique<WholeWrite>(&entry_of(q)));
  }
  auto& library = library_of("aten", c10::DispatchKey::CUDA);
  library.impl("empty.memory_format", TORCH_FN(empty_over));
  library.impl("empty_strided", TORCH_FN(empty_strided_over));
}

// Registers the autograd router over the autograd-key kernel `qualname` now has (gradkern's Python router);
// `planner` is the Python op that decides a descriptor's plan.
void attach_autograd(std::string qualname, std::string planner) {
  AgEntry* e;
  {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    auto& slot = g_ag_entries[qualname];
    if (!slot) slot = std::make_unique<AgEntry>(find_op(qualname));
    e = slot.get();
  }
  e->python = e->op.getComputedKernelForDispatchKey(c10::DispatchKey::AutogradCUDA);
  e->planner = find_op(planner);
  impl_over(qualname, c10::DispatchKey::AutogradCUDA, std::make_unique<AgRouter>(e));
}

void ag_commit(bool fast, std::vector<int64_t> save, std::vector<int64_t> outs, int64_t desc, std::string fused,
               std::string composite, std::string name) {
  AgPending& pending = t_ag_pending;
  if (pending.entry == nullptr) return;
  auto p = std::make_shared<AgPlan>();
  p->fast = fast;
  if (fast) {
    p->save = std::move(save);
    p->outs = std::move(outs);
    p->desc = desc;
    p->fused = find_op(fused);
    p->composite = find_op(composite);
    p->name = std::move(name);
  }
  std::unique_lock<std::shared_mutex> lock(pending.entry->mutex);
  if (pending.entry->plans.size() >= kMaxPrograms) pending.entry->plans.clear();
  pending.entry->plans[pending.key] = std::move(p);
  pending.entry = nullptr;
}

// Entries are retired, not freed: a call another thread is making through a router may still read its entry.
std::vector<std::unique_ptr<Entry>> g_retired;

void detach_all() {
  g_enabled = false;
  g_libraries.clear();
  std::lock_guard<std::mutex> lock(g_entries_mutex);
  for (auto& [name, e] : g_entries) {
    {
      std::unique_lock<std::shared_mutex> l(e->mutex);  // (a replay in flight holds its own reference)
      e->programs.clear();
      e->seen.clear();
    }
    g_retired.push_back(std::move(e));
  }
  g_entries.clear();
  for (auto& [name, e] : g_ag_entries) {
    {
      std::unique_lock<std::shared_mutex> l(e->mutex);
      e->plans.clear();
    }
    g_ag_retired.push_back(std::move(e));
  }
  g_ag_entries.clear();
}

void set_state(bool enabled, bool always) {
  g_always = always;
  g_enabled = enabled;
}

void clear() {
  std::lock_guard<std::mutex> lock(g_entries_mutex);
  for (auto& [name, e] : g_entries) {
    std::unique_lock<std::shared_mutex> l(e->mutex);
    e->programs.clear();
    e->seen.clear();
  }
  for (auto& [name, e] : g_ag_entries) {
    std::unique_lock<std::shared_mutex> l(e->mutex);
    e->plans.clear();
  }
}

// Stores what the recorder running on this thread found for its descriptor: kind PYTHON (keep calling the Python
// router), STOCK (call ATen's kernel), or REPLAY with the program. Returns whether a program was stored.
bool commit(int64_t kind, std::vector<int64_t> words, std::vector<at::Tensor> consts) {
  Pending& pending = t_pending;
  if (pending.entry == nullptr) return false;
  auto p = std::make_shared<Program>();
  p->kind = static_cast<Kind>(kind);
  p->device = pending.device;
  p->words = std::move(words);
  p->consts = std::move(consts);
  if (p->kind == REPLAY && !decode(*p)) p = std::make_shared<Program>();  // (refused: kind PYTHON)
  std::unique_lock<std::shared_mutex> lock(pending.entry->mutex);
  if (pending.entry->programs.size() >= kMaxPrograms) pending.entry->programs.clear();
  pending.entry->programs[pending.key] = p;
  bool stored = p->kind == static_cast<Kind>(kind);
  pending.entry = nullptr;
  return stored;
}

int64_t programs() {
  std::lock_guard<std::mutex> lock(g_entries_mutex);
  int64_t n = 0;
  for (auto& [name, e] : g_entries) {
    std::shared_lock<std::shared_mutex> l(e->mutex);
    for (auto& [k, p] : e->programs) n += p->kind == REPLAY;
  }
  return n;
}

}  // namespace

TORCH_LIBRARY(gradkern_native, m) {
  m.def("capture_stock(str qualname) -> ()", &capture_stock);
  m.def("attach(str qualname, str recorder, bool always) -> ()", &attach);
  m.def("detach_all() -> ()", &detach_all);
  m.def("set_state(bool enabled, bool always) -> ()", &set_state);
  m.def("clear() -> ()", &clear);
  m.def("commit(int kind, int[] words, Tensor[] consts) -> bool", &commit);
  m.def("programs() -> int", &programs);
  m.def("attach_autograd(str qualname, str planner) -> ()", &attach_autograd);
  m.def("attach_whole_write(str[] qualnames) -> ()", &attach_whole_write);
  m.def("ag_commit(bool fast, int[] save, int[] outs, int desc, str fused, str composite, str name) -> ()",
        &ag_commit);
}
