"""Causal language model: a small GPT (pre-norm transformer) over byte tokens.

Attention goes through ``torch.nn.functional.scaled_dot_product_attention``, which picks the fastest kernel
the device has (flash or memory-efficient attention on GPUs).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from multigpu import ConfigurationError, TemplateModule, WeightedMean, at_least_fp32


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"--model.init_args.n_embd={n_embd} must be a multiple of n_head={n_head}")
        self.head_dim = n_embd // n_head
        # three projections, not one fused: a tensor-parallel split of each keeps whole heads on every rank
        self.query = nn.Linear(n_embd, n_embd)
        self.key = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        batch, time, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tensor_parallel_size of them
        q, k, v = (
            t.view(batch, time, -1, self.head_dim).transpose(1, 2) for t in (self.query(x), self.key(x), self.value(x))
        )
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(batch, time, -1)))


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x MLP, each with a residual connection."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Layers(nn.Module):
    """Consecutive layers of the GPT: the embeddings where they start from token ids, blocks, and the final norm
    and output layer where they end at the logits. ``GPT`` holds all of them; ``GPT.stage`` gives a pipeline stage
    some of them (the same modules, not copies)."""

    def __init__(
        self,
        block_size: int,
        blocks: nn.ModuleList,
        embeddings: tuple[nn.Embedding, nn.Embedding, nn.Dropout] | None = None,
        head: tuple[nn.LayerNorm, nn.Linear] | None = None,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        # registered in this order (the GPT's parameter names and order): embeddings, blocks, norm, output layer
        self.tok_emb, self.pos_emb, self.drop = embeddings or (None, None, None)
        self.blocks = blocks
        self.ln_f, self.lm_head = head or (None, None)

    def layers(self) -> list[Block]:
        """The blocks, in order (under ``pipeline``, only those whose stages this process runs: the others are
        placeholders without parameters)."""
        return [block for block in self.blocks if isinstance(block, Block)]

    def forward(self, x: Tensor) -> Tensor:
        if self.tok_emb is not None:  # token ids in
            time = x.shape[1]
            if time > self.block_size:
                raise ValueError(f"sequence of {time} tokens is longer than the model's block_size={self.block_size}")
            positions = torch.arange(time, device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.lm_head is not None else x  # logits, or the next stage's input


class GPT(Layers):
    """Token and position embeddings, ``n_layer`` blocks, a final norm and an output layer tied to the embedding."""

    def __init__(
        self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        tok_emb, pos_emb = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        ln_f, lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)
        lm_head.weight = tok_emb.weight  # weight tying: fewer parameters, better small models
        super().__init__(block_size, blocks, (tok_emb, pos_emb, nn.Dropout(dropout)), (ln_f, lm_head))
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # scaled init of residual projections (GPT-2): keeps the residual stream's variance flat in depth
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def stage(self, first: int, end: int) -> Layers:
        """Blocks ``first`` to ``end - 1``, with the embeddings if ``first`` is 0 and the final norm and output
        layer if ``end`` is the last: this network's own modules, so a stage trains the GPT's weights."""
        embeddings = (self.tok_emb, self.pos_emb, self.drop) if first == 0 else None
        head = (self.ln_f, self.lm_head) if end == len(self.blocks) else None
        return Layers(self.block_size, nn.ModuleList(self.blocks[first:end]), embeddings, head)


class CausalLanguageModel(TemplateModule):
    """Next-token prediction with ``GPT``; logs ``{train,val,test}/loss`` (nats per token) and ``val/perplexity``.

    Args:
        vocab_size: Token ids are below this (256 for the byte-level ``TextDataModule``).
        block_size: Longest sequence the model accepts.
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        n_embd: Width of the residual stream.
        dropout: Dropout rate (0 keeps training identical across strategies).
        pipeline_split: Under ``--trainer.strategy=pipeline``, the first block of each stage after the first (e.g.
            ``[3]`` for two stages of blocks 0-2 and 3-5); unset, the blocks are balanced by parameter count.
        **kwargs: The optimizer and LR scheduler options (``TemplateModule``).
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        pipeline_split: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.net = GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        #: of the whole network, also where a pipeline process holds part of it
        self.num_parameters = sum(p.numel() for p in self.net.parameters())
        self.num_position_parameters = self.net.pos_emb.weight.numel()
        # one mean per stage; WeightedMean keeps the per-step update free of host-device syncs
        self.train_loss, self.val_loss, self.test_loss = WeightedMean(), WeightedMean(), WeightedMean()

    def configure_model(self) -> None:
        """Under ``fsdp2`` / ``tensor_parallel`` / ``pipeline``: split attention and MLP over the tensor-parallel
        ranks (if any), then shard each block, and the rest of the network, over the data-parallel ranks with
        FSDP2. Under ``pipeline`` only the blocks of this process's stages are here, and the strategy shards the
        rest of each stage itself (no process runs the whole network).

        Lightning calls this once the processes exist (``self.device_mesh`` is set only under those strategies)
        and again for test or predict after fit, when the network is already sharded.
        """
        mesh = self.device_mesh
        if mesh is None or any(isinstance(module, FSDPModule) for module in self.net.modules()):
            return
        tensor_parallel = mesh["tensor_parallel"]
        if tensor_parallel.size() > 1:
            if self.hparams.n_head % tensor_parallel.size():
                raise ConfigurationError(
                    f"--model.init_args.n_head={self.hparams.n_head} heads cannot be split evenly over"
                    f" {tensor_parallel.size()} tensor-parallel ranks. Fix: choose n_head as a multiple of"
                    " --trainer.devices (processes per node), or set the strategy's tensor_parallel_size."
                )
            # Megatron's split: query/key/value and the MLP's first layer by output features (whole heads per
            # rank), the output projections by input features, so each sub-layer needs one all-reduce
            plan = {
                "attn.query": ColwiseParallel(),
                "attn.key": ColwiseParallel(),
                "attn.value": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "mlp.0": ColwiseParallel(),
                "mlp.2": RowwiseParallel(),
            }
            for block in self.net.layers():
                parallelize_module(block, tensor_parallel, plan)
        data_parallel = mesh["data_parallel"]
        for block in self.net.layers():
            fully_shard(block, mesh=data_parallel)
        if "pipeline" not in (mesh.mesh_dim_names or ()):  # under pipeline each stage shards its rest itself
            fully_shard(self.net, mesh=data_parallel)  # embeddings, final norm and (tied) output layer

    def check_datamodule(self, datamodule: Any) -> None:
        """The data's sequences must fit this model's context (multigpu.hooks: checked once both are built)."""
        data_block = getattr(datamodule, "block_size", None)
        if isinstance(data_block, int) and data_block > self.hparams.block_size:
            model_block = self.hparams.block_size
            raise ConfigurationError(
                f"--data.init_args.block_size={data_block} is longer than the model's --model.init_args.block_size="
                f"{model_block}: its position table has no entry past {model_block} tokens. Fix: set both to the"
                f" same value (e.g. --data.init_args.block_size={model_block}), or raise the model's."
            )

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        """Under ``pipeline``: the layers of stage ``index`` of ``count`` (``multigpu/strategies/pipeline/``), this
        model's own modules. The embeddings go to the first stage, the final norm and the output layer to the last;
        the blocks are cut at ``pipeline_split`` or balanced by parameter count."""
        n_layer = self.hparams.n_layer
        if count > n_layer:
            raise ConfigurationError(
                f"--model.init_args.n_layer={n_layer} blocks cannot make {count} pipeline stages of at least one block"
                " (the pipeline's processes x --pipeline.stages_per_rank). Fix: run at most"
                f" {n_layer} stages (fewer processes or stages per rank), or a model with more layers."
            )
        bounds = [0, *(self.hparams.pipeline_split or balanced_split(self.net, count)), n_layer]
        if len(bounds) != count + 1 or any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ConfigurationError(
                f"--model.init_args.pipeline_split={self.hparams.pipeline_split} does not cut {n_layer} blocks into"
                f" {count} stages of at least one block. Fix: give {count - 1} increasing block indices between 1 and"
                f" {n_layer - 1}, or leave it unset to balance the stages by parameter count."
            )
        return self.net.stage(bounds[index], bounds[index + 1])

    def pipeline_loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """The mean next-token cross-entropy of one micro-batch, from the last stage's logits."""
        return F.cross_entropy(at_least_fp32(logits).flatten(0, 1), targets.flatten())

    def flops_per_token(self, sequence_length: int | None = None) -> int:
        """Training FLOPs per token (forward + backward): 6 per parameter plus attention (PaLM, appendix B)."""
        hp = self.hparams
        time = sequence_length or hp.block_size
        non_embedding = self.num_parameters - self.num_position_parameters
        return 6 * non_embedding + 12 * hp.n_layer * hp.n_embd * time

    def flops_per_sample(self, sequence_length: int | None = None) -> int:
        """Training FLOPs of one sequence (``block_size`` tokens unless given), for the throughput monitor's MFU."""
        time = sequence_length or self.hparams.block_size
        return self.flops_per_token(time) * time

    def forward(self, tokens: Tensor) -> Tensor:
        """Token ids ``(N, T)`` -> next-token logits ``(N, T, vocab_size)``."""
        return self.net(tokens)

    def model_step(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Mean next-token cross-entropy of a batch ``(inputs, targets)``."""
        inputs, targets = batch
        return self.pipeline_loss(self(inputs), targets)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One micro-batch of training; returns the loss Lightning backpropagates."""
        loss = self.model_step(batch)
        self.train_loss.update(loss.detach(), weight=batch[1].numel())
        if self.should_log_step():
            self.log("train/loss", loss.detach(), sync_dist=True)  # shown by the progress output: not prog_bar
        return loss

    def on_train_epoch_end(self) -> None:
        self.log_computed({"train/loss_epoch": self.train_loss.compute()})  # reduced over all processes
        self.train_loss.reset()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Accumulate validation loss, weighted by the number of tokens."""
        loss = self.model_step(batch)
        self.val_loss.update(loss, weight=batch[1].numel())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()  # reduced over all processes
        self.log_computed({"val/loss": loss, "val/perplexity": loss.exp()}, prog_bar=True)
        self.val_loss.reset()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Accumulate test loss, weighted by the number of tokens."""
        loss = self.model_step(batch)
        self.test_loss.update(loss, weight=batch[1].numel())

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.log_computed({"test/loss": loss, "test/perplexity": loss.exp()})
        self.test_loss.reset()

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The most likely next token after every position, ``(N, T)``."""
        inputs, _ = batch
        return self(inputs).argmax(dim=-1)

    @torch.no_grad()
    def generate(
        self, tokens: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> Tensor:
        """Extend ``tokens`` ``(N, T)`` by sampling ``max_new_tokens`` tokens; ``temperature=0`` is greedy."""
        for _ in range(max_new_tokens):
            logits = self(tokens[:, -self.hparams.block_size :])[:, -1].float()
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(logits.softmax(dim=-1), 1)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens


def balanced_split(net: GPT, count: int) -> list[int]:
    """The first block of each stage after the first, so that the stages hold about equal parameters: the
    embeddings count on the first stage, the final norm on the last (the output layer is the tied embedding)."""
    sizes = [sum(p.numel() for p in block.parameters()) for block in net.layers()]
    first = sum(p.numel() for p in (*net.tok_emb.parameters(), *net.pos_emb.parameters()))
    total = first + sum(sizes) + sum(p.numel() for p in net.ln_f.parameters())
    cuts, held = [], first
    for index, size in enumerate(sizes[:-1]):
        held += size
        remaining_stages = count - 1 - len(cuts)
        blocks_left = len(sizes) - index - 1
        target = total * (len(cuts) + 1) / count
        if remaining_stages and (held >= target or blocks_left == remaining_stages):
            cuts.append(index + 1)
    return cuts
