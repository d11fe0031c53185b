"""Direct preference optimisation on pairs: DPO, IPO (and any loss of the same signature), chosen by
the `algorithm.loss` node's `_target_` (losses/preference.py), never by a string switch."""
from __future__ import annotations

from typing import Callable

from data_modules.preferences import PreferenceBatch
from losses.common import aggregate
from trainers.preference import PreferenceModule


class DPOModule(PreferenceModule):
    """`loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected)` → (loss [B], metrics), all [B]
    sequence log-probs; β and the loss's other hyperparameters are bound in the config.

    `nll_coef` > 0 adds that multiple of the chosen answers' token-mean NLL (RPO, Pang et al. 2024;
    Llama 3 uses 0.2), which keeps DPO from lowering the likelihood of the answers it prefers."""

    def __init__(self, loss: Callable, nll_coef: float, **kwargs):
        super().__init__(**kwargs)
        self.loss_fn, self.nll_coef = loss, nll_coef

    def micro_loss(self, batch: PreferenceBatch):
        if batch.desirable is not None:
            raise TypeError(f"algorithm={self.algorithm_name} needs pairs but got unpaired records "
                            f"(algorithm.unpaired must be false)")
        n = len(batch)
        tokens, logps = self.batch_token_logps(self.policy, batch)  # [2B]: chosen rows, then rejected rows
        ref = self.reference_logps(batch)
        per_pair, metrics = self.loss_fn(logps[:n], logps[n:], ref[:n], ref[n:])
        nll = aggregate(-tokens[:n], batch.sequences.completion_mask[:n], "token_mean")
        loss = per_pair.mean() + self.nll_coef * nll if self.nll_coef else per_pair.mean()
        return loss, metrics | {"logps_chosen": logps[:n].detach().mean(),
                                "logps_rejected": logps[n:].detach().mean(), "nll_chosen": nll.detach()}
