"""The AFT causal language model for transformers (Zhai et al., "An Attention Free Transformer", arXiv:2105.14103).

A decoder-only stack of pre-norm :class:`~aft_hub.layers.AftBlock` layers whose token mixers are causal AFT
operators (local, simple, full or 1-D conv). All AFT mathematics lives in :mod:`aft_hub.ops` and
:mod:`aft_hub.layers`; this file maps :class:`AftConfig` onto those modules and adds the transformers front end.

Generation keeps a decoding state per layer in an :class:`AftCache` (a :class:`transformers.Cache`): the running
sums of :mod:`aft_hub.ops.decode`, whose size does not depend on the context length for "simple", "local" and
"conv" (AFT-full keeps every past key and value). The model builds the cache itself when ``use_cache`` is on; beam
search reorders it through ``AftCache.reorder_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import ModelOutput
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils import can_return_tuple, logging

from ..layers import AftBlock, AftConv1d, AftFull, AftLocal, AftSimple, ConvKernel, LayerScale, PositionBias
from ..ops.decode import AFTDecodeState, AFTFullDecodeState
from .configuration_aft import AftConfig

logger = logging.get_logger(__name__)

__all__ = ["AftCache", "AftModel", "AftForCausalLM", "AftPreTrainedModel", "AftModelOutput", "AftCausalLMOutput"]


# ----------------------------------------------------------------------------------------------------------------
# decoding state
# ----------------------------------------------------------------------------------------------------------------


class AftCacheLayer:
    """The decoding state of one layer: an :class:`~aft_hub.ops.decode.AFTDecodeState` (simple, local, conv) or
    :class:`~aft_hub.ops.decode.AFTFullDecodeState` (full), None before the first token."""

    supports_early_init = False
    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self) -> None:
        self.state: AFTDecodeState | AFTFullDecodeState | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.state).__name__})"

    def get_seq_length(self) -> int:
        return 0 if self.state is None else self.state.step

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        return 0 if self.state is None else self.state.nbytes()

    def reset(self) -> None:
        self.state = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.state is not None:
            self.state = self.state.reorder(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            self.state = self.state.batch_repeat_interleave(repeats)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("AFT decoding states fold past tokens into running sums and cannot be cropped.")

    def offload(self) -> None:
        if self.state is not None:
            self.state = self.state.to("cpu")

    def prefetch(self) -> None:
        pass


class AftCache(Cache):
    """Decoding state of an AFT language model: one :class:`AftCacheLayer` per layer, plus the bookkeeping of
    positions shared by the layers.

    For "simple", "local" and "conv" the size is independent of the number of tokens seen (see :meth:`nbytes`);
    "full" keeps every past key and value. Built by :class:`AftModel` when ``use_cache`` is on; it can also be
    passed in to continue a sequence (give only the new tokens, or the whole sequence to ``generate``).

    Attributes:
        next_positions: (B,) long, the position of each row's next real token (left padding takes none).
        key_positions: (B, n) long, positions of the keys the absolute position bias still needs: the last
            window - 1 for "local", all of them for "full", none otherwise (-1 before the sequence start).
    """

    def __init__(self, config: AftConfig) -> None:
        super().__init__(layers=[AftCacheLayer() for _ in range(config.num_hidden_layers)])
        self.aft_type = config.aft_type
        self.window_size = config.window_size
        self.seen_tokens = 0
        self.next_positions: torch.Tensor | None = None
        self.key_positions: torch.Tensor | None = None

    # ---- bookkeeping -------------------------------------------------------------------------------------------

    @property
    def _kept_positions(self) -> int | None:
        """How many past key positions the bias needs: window - 1 (local), all (full, None) or 0."""
        if self.aft_type == "local":
            return self.window_size - 1
        if self.aft_type == "full":
            return None
        return 0

    def _record(self, positions: torch.Tensor, next_positions: torch.Tensor) -> None:
        """Record the positions (B, T) of T tokens just absorbed and the next position of each row (B,)."""
        keep = self._kept_positions
        keys = positions if self.key_positions is None else torch.cat([self.key_positions, positions], dim=1)
        if keep is not None:
            keys = keys[:, max(keys.shape[1] - keep, 0) :]
            if keys.shape[1] < keep:
                keys = torch.cat([keys.new_full((keys.shape[0], keep - keys.shape[1]), -1), keys], dim=1)
        self.key_positions = keys
        self.next_positions = next_positions
        self.seen_tokens += positions.shape[1]

    # ---- Cache API ---------------------------------------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of tokens absorbed (padding included)."""
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return -1 if self.next_positions is None else int(self.next_positions.shape[0])

    def _select(self, fn) -> None:
        if self.next_positions is not None:
            self.next_positions = fn(self.next_positions)
        if self.key_positions is not None:
            self.key_positions = fn(self.key_positions)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select the rows of the next step (beam search); in place."""
        super().reorder_cache(beam_idx)
        self._select(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._select(lambda t: t.index_select(0, indices.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._select(lambda t: t.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0
        self.next_positions = None
        self.key_positions = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("AFT decoding states fold past tokens into running sums and cannot be cropped.")

    def nbytes(self) -> int:
        """Bytes held by the decoding state: every layer's state plus the position bookkeeping."""
        total = sum(layer.nbytes() for layer in self.layers)
        for t in (self.next_positions, self.key_positions):
            if t is not None:
                total += t.numel() * t.element_size()
        return total

    def __repr__(self) -> str:
        return f"{type(self).__name__}(aft_type={self.aft_type!r}, seen_tokens={self.seen_tokens}, layers={len(self)})"


# ----------------------------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------------------------


def _build_mixer(config: AftConfig) -> nn.Module:
    d = config.hidden_size
    common = dict(qkv_bias=config.qkv_bias, proj_drop=config.dropout)
    if config.aft_type == "local":
        return AftLocal(
            d,
            config.max_position_embeddings,
            window=config.window_size,
            bias_rank=config.position_bias_rank,
            causal=True,
            **common,
        )
    if config.aft_type == "full":
        return AftFull(d, config.max_position_embeddings, bias_rank=config.position_bias_rank, causal=True, **common)
    if config.aft_type == "simple":
        return AftSimple(d, causal=True, **common)
    return AftConv1d(d, heads=config.conv_heads, kernel_size=config.conv_kernel_size, causal=True, **common)


class AftDecoderLayer(AftBlock, GradientCheckpointingLayer):
    """An :class:`~aft_hub.layers.AftBlock` with a causal mixer, checkpointable, that can also decode step by step."""

    def __init__(self, config: AftConfig, layer_idx: int) -> None:
        super().__init__(
            config.hidden_size,
            _build_mixer(config),
            drop=config.dropout,
            act_layer=partial(ACT2FN.__getitem__, config.hidden_act),
            norm_layer=partial(nn.LayerNorm, eps=config.layer_norm_eps),
            mlp_hidden_dim=config.intermediate_size,
        )
        self.layer_idx = layer_idx

    def _residual(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(mixed))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: AftCache | None = None,
    ) -> torch.Tensor:
        """(B, T, C) -> (B, T, C); with a cache, also stores this layer's decoding state after the T tokens."""
        if cache is None:
            return super().forward(hidden_states, key_mask=key_mask, position_ids=position_ids)
        mixed, state = self.mixer.prefill(self.norm1(hidden_states), key_mask=key_mask, position_ids=position_ids)
        cache.layers[self.layer_idx].state = state
        return self._residual(hidden_states, mixed)

    def step(
        self,
        hidden_t: torch.Tensor,
        cache: AftCache,
        key_mask_t: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token (B, C) -> (B, C), updating this layer's state in ``cache``."""
        layer_cache = cache.layers[self.layer_idx]
        mixed, layer_cache.state = self.mixer.step(
            self.norm1(hidden_t), layer_cache.state, key_mask_t=key_mask_t, position_ids=position_ids
        )
        return self._residual(hidden_t, mixed)


# ----------------------------------------------------------------------------------------------------------------
# pretrained model
# ----------------------------------------------------------------------------------------------------------------


class AftPreTrainedModel(PreTrainedModel):
    config: AftConfig
    config_class = AftConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AftDecoderLayer"]
    _is_stateful = True  # no assisted decoding: a state cannot be rolled back

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not build a DynamicCache: the model builds its own AftCache
        return False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Every parameter, including the AFT position biases and conv kernels (no uninitialised memory)."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            if module.weight is not None:
                init.ones_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, PositionBias):
            if module.rank is None:
                init.zeros_(module.weight)
            else:
                init.normal_(module.u, mean=0.0, std=module.init_std)
                init.normal_(module.v, mean=0.0, std=module.init_std)
        elif isinstance(module, ConvKernel):
            init.normal_(module.weight, mean=0.0, std=1.0)
            init.zeros_(module.gamma)
            init.zeros_(module.beta)
        elif isinstance(module, LayerScale):
            init.constant_(module.gamma, module.init_values)


@dataclass
class AftModelOutput(ModelOutput):
    """Outputs of :class:`AftModel`.

    Args:
        last_hidden_state: (B, T, C) after the final layer norm.
        cache: the decoding state after these tokens (with ``use_cache``).
        hidden_states: with ``output_hidden_states``, num_hidden_layers + 1 tensors (B, T, C): the embeddings, the
            outputs of the layers, the last one after the final layer norm.
    """

    last_hidden_state: torch.Tensor | None = None
    cache: AftCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class AftCausalLMOutput(ModelOutput):
    """Outputs of :class:`AftForCausalLM`.

    Args:
        loss: next-token cross-entropy, when ``labels`` are given.
        logits: (B, T, vocab_size).
        cache: the decoding state after these tokens (with ``use_cache``).
        hidden_states: as in :class:`AftModelOutput`.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: AftCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


# ----------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------


class AftModel(AftPreTrainedModel):
    """The bare AFT decoder: byte (token) embeddings, AFT blocks and a final layer norm.

    There is no position embedding: AFT-local and AFT-full carry an absolute pairwise position bias (at most
    ``max_position_embeddings`` positions), AFT-conv a relative one, AFT-simple none.
    """

    def __init__(self, config: AftConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([AftDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    # ---- positions ---------------------------------------------------------------------------------------------

    def _check_positions(self, positions: torch.Tensor) -> None:
        if not self.config.has_absolute_positions or positions.numel() == 0:
            return
        top = int(positions.max())
        if top >= self.config.max_position_embeddings:
            raise ValueError(
                f"AFT-{self.config.aft_type} has an absolute position bias learned for "
                f"{self.config.max_position_embeddings} positions (max_position_embeddings), but position {top} was "
                "requested. Use a shorter context; the 'conv' and 'simple' variants have no such limit."
            )

    @staticmethod
    def _prompt_positions(
        attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, B: int, T: int, past: int, device
    ) -> torch.Tensor:
        """Positions (B, T) of the T new tokens when no cache holds earlier ones."""
        if position_ids is not None:
            return position_ids.to(device=device, dtype=torch.long).expand(B, T)
        if attention_mask is not None:
            # every real token counts one position: left padding does not shift a row's positions
            return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -T:]
        return torch.arange(past, past + T, device=device).expand(B, T)

    # ---- forward -----------------------------------------------------------------------------------------------

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: AftCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> AftModelOutput:
        r"""
        Args:
            input_ids: (B, T) token ids; with a cache holding earlier tokens, only the new ones.
            attention_mask: (B, T) or, with a cache, (B, past + T); 0 marks padding, whose keys take no part. Each
                row's positions count its real tokens only, so a left-padded row equals the row alone.
            position_ids: (B, T) positions for the absolute position bias of "local" / "full" (default: from the
                attention mask, or past + arange(T)).
            cache: an :class:`AftCache` from a previous call, to continue the sequence.
            inputs_embeds: (B, T, C) instead of ``input_ids``.
            use_cache: return the decoding state after these tokens (default: the config's ``use_cache`` outside
                training).
            output_hidden_states: also return every layer's output.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of input_ids and inputs_embeds.")
        if output_attentions:
            raise ValueError("AFT computes no attention weights: output_attentions is not available.")
        if cache is not None and not isinstance(cache, AftCache):
            raise TypeError(f"cache must be an AftCache (built by the model with use_cache=True), got {type(cache)}.")
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        if use_cache and self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing; using use_cache=False.")
            use_cache = False

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        B, T = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        if use_cache and cache is None:
            cache = AftCache(self.config)
        past = cache.get_seq_length() if cache is not None else 0

        key_mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < T:
                raise ValueError(
                    f"attention_mask must be (batch, past + seq_len) with at least {T} columns, got "
                    f"{tuple(attention_mask.shape)}."
                )
            key_mask = attention_mask[:, -T:].to(device=device, dtype=torch.bool)
        if position_ids is not None and position_ids.shape[-1] != T:
            raise ValueError(
                f"position_ids must have {T} columns (one per new token), got {tuple(position_ids.shape)}."
            )

        hidden_states = self.dropout(inputs_embeds)
        all_hidden = [hidden_states] if output_hidden_states else None

        if cache is not None and past > 0:
            hidden_states, layer_outputs = self._decode(hidden_states, cache, key_mask, position_ids)
            if all_hidden is not None:
                all_hidden.extend(layer_outputs)
        else:
            positions = self._prompt_positions(attention_mask, position_ids, B, T, past, device)
            mixer_positions = None
            if self.config.has_absolute_positions:
                self._check_positions(positions)
                # the shared (T, T) bias serves every row whose real tokens sit at their index positions
                plain = torch.arange(T, device=device).expand(B, T)
                differs = positions != plain if key_mask is None else (positions != plain) & key_mask
                mixer_positions = positions if bool(differs.any()) else None
            layer_key_mask = None if key_mask is None or bool(key_mask.all()) else key_mask
            for layer in self.layers:
                hidden_states = layer(
                    hidden_states, key_mask=layer_key_mask, position_ids=mixer_positions, cache=cache
                )
                if all_hidden is not None:
                    all_hidden.append(hidden_states)
            if cache is not None:
                if position_ids is None and attention_mask is not None:
                    next_positions = attention_mask.to(device).long().sum(-1)
                else:
                    next_positions = positions[:, -1] + 1
                cache._record(positions, next_positions)

        hidden_states = self.norm(hidden_states)
        if all_hidden is not None:
            all_hidden[-1] = hidden_states
        return AftModelOutput(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
        )

    def _decode(
        self,
        hidden_states: torch.Tensor,
        cache: AftCache,
        key_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Continue from the cache one token at a time; returns (B, T, C) and each layer's (B, T, C) output."""
        B, T = hidden_states.shape[:2]
        if cache.batch_size != B:
            raise ValueError(f"The cache holds {cache.batch_size} rows but the input has {B}.")
        per_layer: list[list[torch.Tensor]] = [[] for _ in self.layers]
        outputs = []
        for i in range(T):
            h = hidden_states[:, i]
            mask_t = None if key_mask is None else key_mask[:, i]
            if position_ids is not None:
                pos_t = position_ids[..., i].to(device=h.device, dtype=torch.long).expand(B)
                next_positions = pos_t + 1
            else:
                pos_t = cache.next_positions
                next_positions = pos_t + 1 if mask_t is None else pos_t + mask_t.long()
            window_positions = None
            if self.config.has_absolute_positions:
                self._check_positions(pos_t)
                window_positions = torch.cat([cache.key_positions, pos_t[:, None]], dim=1)
            for j, layer in enumerate(self.layers):
                h = layer.step(h, cache, key_mask_t=mask_t, position_ids=window_positions)
                per_layer[j].append(h)
            cache._record(pos_t[:, None], next_positions)
            outputs.append(h)
        return torch.stack(outputs, dim=1), [torch.stack(hs, dim=1) for hs in per_layer]


class AftForCausalLM(AftPreTrainedModel, GenerationMixin):
    """AFT language model: :class:`AftModel` and a linear head (tied to the input embeddings by default)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: AftConfig) -> None:
        super().__init__(config)
        self.model = AftModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: AftCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> AftCausalLMOutput:
        r"""
        Args:
            labels: (B, T) next-token targets aligned with the inputs (shifted inside); -100 is ignored.
            logits_to_keep: compute logits for the last n positions only (0: all).

        The other arguments are those of :meth:`AftModel.forward`.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return AftCausalLMOutput(loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states)
