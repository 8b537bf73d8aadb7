# The GPU machine's setup, `source .gpu/b/setup.sh` from the project root (`make gpu-pack`
# copies this file there). Once per machine: joins the TVM wheel's two halves (/tmp/gpua from
# command 1, .gpu/b), installs it with tvm-ffi and the carried wheels into /tmp/site, unpacks
# what the pack prepared (the nvcc cache of tvm-rtask's kernels) into /tmp/tvm-rtask-prep and
# builds the native library with CMake into /tmp/rbuild. Every time: exports the paths.
# Each piece's seconds go to /tmp/tvm-rtask-setup.log (the window records them).
_gpu_b=.gpu/b
_t0=$(date +%s)
_say() { echo "setup: $* ($(($(date +%s) - _t0)) s)" | tee -a /tmp/tvm-rtask-setup.log; }
if [ ! -d /tmp/site/tvm ]; then
  _n=$(cat "$_gpu_b/tvm_wheel_name")
  _a=.gpu/a; [ -d /tmp/gpua ] && _a=/tmp/gpua
  if cat "$_a"/tvm.part.* "$_gpu_b"/tvm.part.* > "/tmp/$_n" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      "/tmp/$_n" "$_gpu_b"/*.whl 2>&1 | tail -3
    rm -f "/tmp/$_n"
    _say "TVM and the wheels installed into /tmp/site"
  else
    _say "TVM's first half is missing: run command 1 (carry .gpu/a) first"
  fi
fi
if [ -f "$_gpu_b/prep.tar.xz" ] && [ ! -f /tmp/tvm-rtask-prep/manifest.json ]; then
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$_gpu_b/prep.tar.xz" /tmp/tvm-rtask-prep &&
    _say "prepared builds unpacked into /tmp/tvm-rtask-prep"
fi
export PYTHONPATH=/tmp/site:$PWD
_cr=$(python3 - <<'PY'
import glob, os
for pat in ("/usr/**/libcudart.so.13*", "/usr/local/lib/python3*/**/libcudart.so.13*",
            "/opt/**/libcudart.so.13*"):
    hits = glob.glob(pat, recursive=True)
    if hits:
        print(os.path.dirname(hits[0]))
        break
PY
)
[ -n "$_cr" ] && export LD_LIBRARY_PATH=$_cr:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -f /tmp/rbuild/libtvm_rtask_runtime.so ]; then
  { cmake -S . -B /tmp/rbuild -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$(command -v python3)" && cmake --build /tmp/rbuild; } \
    >/tmp/cmake.log 2>&1 || tail -20 /tmp/cmake.log
  _say "native library built into /tmp/rbuild"
fi
export LD_LIBRARY_PATH=/tmp/rbuild:${LD_LIBRARY_PATH:-}
export TVM_RTASK_RUNTIME_LIB=/tmp/rbuild/libtvm_rtask_runtime.so
export TVM_RTASK_PASS_CONFIG_LIB=/tmp/rbuild/libtvm_rtask_pass_config.so
export TVM_RTASK_CUDA_CACHE=/tmp/tvm-rtask-prep/nvcc
export TVM_RTASK_GPU_PREP=/tmp/tvm-rtask-prep
export GPU_PY=python3
