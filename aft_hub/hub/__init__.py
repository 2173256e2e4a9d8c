"""Publishing to the Hugging Face Hub: repo folders, model cards, remote code, upload, autoregistration.

* :func:`publish` = :func:`save_for_hub` (an atomic folder: safetensors weights, config.json for timm and
  transformers, tokenizer, remote code, model card) + :func:`push_to_hub` (one commit, then sha256 verification).
* :class:`CardInfo` / :func:`render_card`: model cards from ``model_cards/*.md``.
* :func:`bundle_remote_code`: self-contained model code for ``trust_remote_code=True``.
* :mod:`aft_hub.hub.autoregister`: the start-up hook that registers the models with timm and transformers.
"""

from .card import CardInfo, render_card, validate_card
from .publish import PublishResult, folder_digests, publish, push_to_hub, save_for_hub
from .remote_code import bundle_remote_code

__all__ = [
    "CardInfo",
    "PublishResult",
    "bundle_remote_code",
    "folder_digests",
    "publish",
    "push_to_hub",
    "render_card",
    "save_for_hub",
    "validate_card",
]
