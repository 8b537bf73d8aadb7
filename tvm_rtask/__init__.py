"""tvm-rtask: Rammer-style persistent kernels for Apache TVM."""

__version__ = "0.1.0"
