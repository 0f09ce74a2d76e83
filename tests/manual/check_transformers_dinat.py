"""Hugging Face transformers' DiNAT, unmodified, through nattn's opt-in `natten` alias, against
nattn's timm `dinat_mini` loaded from the same (converted) state dict: float64 logits.

    pip install "transformers==4.44.2" && python tests/manual/check_transformers_dinat.py

Not part of the suite (transformers is not a test dependency). Measured 2026-11-30 with
transformers 4.44.2: max |difference| 8.9e-16 on logits of size ~1.9. transformers 4.57.6 and
5.24.0 fail inside their own DiNAT attention (a reshape written for 3-D hidden states, and a
transpose that is not heads-first) whatever `natten` provides.
"""

import nattn.compat

nattn.compat.install_natten_alias(metadata=True)  # before transformers is imported

import timm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DinatConfig, DinatForImageClassification  # noqa: E402

from nattn.models.nat import checkpoint_filter_fn  # noqa: E402


def main():
    hf = DinatForImageClassification(DinatConfig(num_labels=10)).eval().double()  # DiNAT-Mini
    with torch.no_grad():  # random RPB tables and norms instead of their zero/one init
        for name, p in hf.named_parameters():
            if name.endswith("rpb") or "norm" in name:
                p.normal_(0, 0.5 if name.endswith("rpb") else 1)
    ours = timm.create_model("dinat_mini", num_classes=10).eval().double()
    ours.load_state_dict(checkpoint_filter_fn(hf.state_dict(), ours), strict=True)
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        a, b = hf(x).logits, ours(x)
    diff = (a - b).abs().max().item()
    print(f"transformers {transformers.__version__}: max |logit difference| {diff:.2e}")
    assert torch.isfinite(a).all() and diff < 1e-9, diff


if __name__ == "__main__":
    main()
