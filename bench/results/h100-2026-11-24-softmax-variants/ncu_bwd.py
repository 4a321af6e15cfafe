"""One launch each (after warm-up) of ours and Inductor's 16-bit softmax backward, for ncu."""
import torch, torch.nn.functional as F
import torch_oss
torch._dynamo.config.recompile_limit = 1024
cb = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
cases = []
for cols in (128, 4096, 32768):
    y = F.softmax(torch.randn(2**26 // cols, cols, dtype=torch.bfloat16, device="cuda") * 3, -1)
    dy = torch.randn_like(y)
    cases.append((y, dy))
    for _ in range(3):
        cb(dy, y); torch.ops.oss.softmax_backward(dy, y, -1, y.dtype)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for y, dy in cases:
    torch.ops.oss.softmax_backward(dy, y, -1, y.dtype)
    cb(dy, y)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
