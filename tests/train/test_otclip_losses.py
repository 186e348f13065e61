"""The OT-CLIP loss family (OT-CLIP Eq. 5-10): InfoNCE equals CLIP's loss, and every OT
member reduces to the one the paper says in its limits."""

import pytest
import torch
import torch.nn.functional as F

from otviz.train.otclip_losses import KINDS, OTCLIPLossConfig, kl_to_identity, otclip_loss

DT = torch.float64


def _batch(seed: int, n: int = 6, d: int = 8):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, d, generator=gen, dtype=DT)
    txt = img + 0.8 * torch.randn(n, d, generator=gen, dtype=DT)
    return img, txt


def _clip_loss(img: torch.Tensor, txt: torch.Tensor, scale: float) -> torch.Tensor:
    logits = scale * F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T
    target = torch.arange(img.shape[0])
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


@pytest.mark.parametrize("scale", [1.0, 14.3, 100.0])
def test_infonce_is_the_clip_loss(scale):
    img, txt = _batch(0)
    assert float(otclip_loss(img, txt, scale, "infonce")) == pytest.approx(
        float(_clip_loss(img, txt, scale)), abs=1e-12
    )


def test_kl_to_identity_generalized():
    plan = torch.tensor([[[0.5, 0.2], [0.1, 0.9]]], dtype=DT)
    ref = (-torch.log(torch.tensor(0.5)) - torch.log(torch.tensor(0.9)) - 2 + 1.7) / 2
    assert float(kl_to_identity(plan)) == pytest.approx(float(ref))


def test_dbot_limits():
    """delta -> inf: row / column softmax, i.e. InfoNCE; delta = 0: entropic OT."""
    img, txt = _batch(1)
    wide = OTCLIPLossConfig(dbot_delta=1e6)
    assert float(otclip_loss(img, txt, 10.0, "dbot", wide)) == pytest.approx(
        float(otclip_loss(img, txt, 10.0, "infonce")), abs=1e-10
    )
    tight = OTCLIPLossConfig(dbot_delta=0.0, n_iters=5000)
    assert float(otclip_loss(img, txt, 10.0, "dbot", tight)) == pytest.approx(
        float(otclip_loss(img, txt, 10.0, "entropic_ot", tight)), abs=1e-7
    )


def test_unbalanced_with_hard_marginals_is_entropic_ot():
    """Eq. 9: alpha1 = alpha2 -> inf gives the hard constraints U(a, b)."""
    img, txt = _batch(2)
    hard = OTCLIPLossConfig(marginal_weight=float("inf"), n_iters=50)
    ent = otclip_loss(img, txt, 10.0, "entropic_ot", hard)
    assert float(otclip_loss(img, txt, 10.0, "unbalanced_ot", hard)) == pytest.approx(float(ent))
    near = OTCLIPLossConfig(marginal_weight=1e7, n_iters=50)
    assert float(otclip_loss(img, txt, 10.0, "unbalanced_ot", near)) == pytest.approx(
        float(ent), abs=1e-5
    )
    soft = OTCLIPLossConfig(n_iters=50)
    assert float(otclip_loss(img, txt, 10.0, "unbalanced_ot", soft)) != pytest.approx(float(ent))


def test_gromov_kinds_without_gromov_term():
    """alpha0 = 0: fgw_ot is entropic OT and ufg_ot is unbalanced OT (App. A.4)."""
    img, txt = _batch(3)
    cfg = OTCLIPLossConfig(alpha0=0.0, n_iters=20)
    for gromov, plain in (("fgw_ot", "entropic_ot"), ("ufg_ot", "unbalanced_ot")):
        assert float(otclip_loss(img, txt, 10.0, gromov, cfg)) == pytest.approx(
            float(otclip_loss(img, txt, 10.0, plain, cfg)), abs=1e-12
        )
    hard = OTCLIPLossConfig(marginal_weight=float("inf"), alpha0=0.05, n_outer_ufg=3,
                            n_outer_fgw=3)
    assert float(otclip_loss(img, txt, 10.0, "ufg_ot", hard)) == pytest.approx(
        float(otclip_loss(img, txt, 10.0, "fgw_ot", hard)), abs=1e-12
    )
    with_term = OTCLIPLossConfig(alpha0=0.05)
    assert float(otclip_loss(img, txt, 10.0, "fgw_ot", with_term)) != pytest.approx(
        float(otclip_loss(img, txt, 10.0, "entropic_ot", with_term))
    )


@pytest.mark.parametrize("kind", KINDS)
def test_aligned_batch_has_near_zero_loss_and_shuffling_raises_it(kind):
    """Orthogonal matched pairs at CLIP's temperature: the plan is (nearly) the identity.
    The Gromov kinds reward the matched edges too, so their plan overshoots the identity
    slightly (relaxed marginals) and the loss is small rather than zero."""
    emb = torch.eye(5, 8, dtype=DT)
    bound = 2e-2 if kind == "ufg_ot" else 1e-3
    assert float(otclip_loss(emb, emb, 100.0, kind)) < bound
    img, txt = _batch(4)
    matched = otclip_loss(img, txt, 20.0, kind)
    shuffled = otclip_loss(img, txt.roll(1, 0), 20.0, kind)
    assert float(shuffled) > float(matched)


def test_unknown_kind():
    img, txt = _batch(5)
    with pytest.raises(ValueError, match="unknown OT-CLIP loss"):
        otclip_loss(img, txt, 10.0, "hinge")


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck(kind):
    img, txt = _batch(6, n=3, d=3)
    img.requires_grad_(True)
    txt.requires_grad_(True)
    scale = torch.tensor(5.0, dtype=DT, requires_grad=True)
    cfg = OTCLIPLossConfig(alpha0=0.05, n_outer_fgw=2, n_outer_ufg=2)
    assert torch.autograd.gradcheck(lambda i, t, s: otclip_loss(i, t, s, kind, cfg),
                                    (img, txt, scale))
