"""Which part of a timm NA model breaks or slows torch.compile: each distinct submodule
(the stem, one block per stage and its parts, downsamplers, the head) compiled on its own with
the input it sees in the model, forward + backward under bf16 autocast on CUDA; prints per
part "ok" with eager and compiled milliseconds, or the exception.

    python benchmarks/compile_bisect.py --model nat_tiny -b 128
"""

import argparse

import timm
import torch

import nattn  # noqa: F401  (registers the timm models)
from nattn.bench.models import step_ms


def parts(model):
    """(name, module) of the submodules worth compiling alone, in model order."""
    out = [("patch_embed", model.patch_embed)]
    for i, stage in enumerate(model.stages):
        if not isinstance(stage.downsample, torch.nn.Identity):
            out.append((f"stages.{i}.downsample", stage.downsample))
        block = stage.blocks[0]
        out += [(f"stages.{i}.blocks.0", block), (f"stages.{i}.blocks.0.norm1", block.norm1),
                (f"stages.{i}.blocks.0.attn", block.attn), (f"stages.{i}.blocks.0.mlp", block.mlp)]
    out.append(("norm", model.norm))
    return out


def timed(fn, iters=10):
    return step_ms(fn, torch.device("cuda"), iters)


def prefixes(model, x):
    """The model cut after the stem and after each stage, then whole with its loss: which
    cut first fails to compile, and dynamo's graph count for the whole model."""
    explain = torch._dynamo.explain(model)(x)
    print(f"whole model: {explain.graph_count} graph(s), {explain.graph_break_count} break(s)", flush=True)
    for reason in explain.break_reasons[:6]:
        print("  break:", str(reason.reason).strip().splitlines()[0][:200], flush=True)
    cuts = [("stem", torch.nn.Sequential(model.patch_embed))]
    for i in range(len(model.stages)):
        cuts.append((f"stem+stages[:{i + 1}]", torch.nn.Sequential(model.patch_embed, *model.stages[:i + 1])))
    cuts.append(("whole model", model))
    for name, m in cuts:
        torch._dynamo.reset()
        compiled = torch.compile(m)
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = compiled(x)
            out.float().square().mean().backward()
            torch.cuda.synchronize()
            print(f"{name:24s} ok", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:24s} FAILED {type(e).__name__}: {str(e).strip().splitlines()[0][:150]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nat_tiny")
    ap.add_argument("-b", "--batch", type=int, default=128)
    ap.add_argument("--prefixes", action="store_true", help="compile growing cuts of the model instead")
    a = ap.parse_args()
    model = timm.create_model(a.model).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    if a.prefixes:
        return prefixes(model, x)
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: inputs.setdefault(name, args[0].detach()))
             for name, m in parts(model)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(x)
    for h in hooks:
        h.remove()
    for name, module in parts(model):
        inp = inputs[name].clone().requires_grad_(True)

        def step(m):
            def run():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = m(inp)
                out.float().square().mean().backward()
            return run

        try:
            eager_ms = timed(step(module))
            torch._dynamo.reset()
            compiled_ms = timed(step(torch.compile(module)))
            print(f"{name:28s} ok  input {tuple(inp.shape)} {inp.dtype} stride {inp.stride()}: "
                  f"eager {eager_ms:.3f} ms, compiled {compiled_ms:.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001  (the point is to see which part fails)
            print(f"{name:28s} FAILED {type(e).__name__}: {str(e).strip().splitlines()[0][:150] if str(e).strip() else ''}",
                  flush=True)


if __name__ == "__main__":
    main()
