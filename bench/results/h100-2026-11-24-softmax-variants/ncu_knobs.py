"""One launch each of ours (knobs: base, 17=2 no release, 17=1 policy off) and Inductor's bf16 backward, for ncu."""
import ctypes, torch, torch.nn.functional as F
import torch_oss
K = (ctypes.c_int * 19).in_dll(ctypes.CDLL(torch_oss._C.__file__), "oss_softmax_cuda_test_knobs")
torch._dynamo.config.recompile_limit = 1024
cb = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
cases = []
for cols in (128, 32768):
    y = F.softmax(torch.randn(2**26 // cols, cols, dtype=torch.bfloat16, device="cuda") * 3, -1)
    dy = torch.randn_like(y)
    cases.append((y, dy))
    for _ in range(3):
        cb(dy, y)
        for v in (0, 2, 1):
            K[17] = v; torch.ops.oss.softmax_backward(dy, y, -1, y.dtype)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for y, dy in cases:
    for v in (0, 2, 1):
        K[17] = v; torch.ops.oss.softmax_backward(dy, y, -1, y.dtype)
    cb(dy, y)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
K[17] = 0
