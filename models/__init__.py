"""NAT / DiNAT / video models built on nattn, registered with timm (installed as nattn.models)."""
