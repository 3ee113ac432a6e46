#!/usr/bin/python3
"""Train the demo LDLM: the autoencoder, then the denoiser on its latents.

    PYTHONPATH=tools nice -n 10 /usr/bin/python3 -m research.train.train --data build/train-data --work build/train-run --threads 2

Phase 1, steps [0, ae_steps): encoder + latent decoder + token decoder on reconstruction
cross-entropy (sampled softmax: the batch's own ids plus --negatives uniform ids), with
Gaussian noise of std U(0, --latent-noise) added to the latents before the latent decoder.
Phase 2, steps [ae_steps, ae_steps + dn_steps): the denoiser (autoencoder frozen) on x̂0
prediction, MSE to the clean latents, x_t = α(t) z + σ(t) ε under the tangent schedule,
t ~ U(0, 1), self-conditioning on a first no-grad x̂0 in --self-cond of the steps; the
shipped denoiser is the EMA of its weights.

Every step's batch, noise and choices come from a generator seeded by (seed, step), so a
run stopped at a checkpoint and resumed gives bit-identical weights at the same thread
count. Checkpoints go to WORK/checkpoint.pt (atomically) every --ckpt-every steps, at the
end of each phase and when --stop-at-step / --stop-after-minutes stop the run; running the
same command again resumes. WORK/log.jsonl holds the loss curves.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from . import common as C

# Flags that define the result; a resumed run must use the same values.
RECIPE = ("init_from", "seed", "ae_steps", "dn_steps", "tokens", "min_len", "max_len", "ae_lr", "dn_lr", "warmup", "negatives",
          "latent_noise", "center_weight", "self_cond", "ema", "weight_decay", "grad_clip")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=C.DATA_DIR, help="output of prepare_data.py (default: build/train-data)")
    ap.add_argument("--work", default=C.RUN_DIR, help="checkpoint and log directory (default: build/train-run)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-from", default=None, metavar="FILE",
                    help="start from a model file written by export.py (its autoencoder, and its denoiser as both "
                         "the trained and the EMA weights) instead of the initialisation; with --ae-steps 0 the "
                         "run trains the denoiser only. Use another --seed than the file's run, so that the steps "
                         "see other windows and noise")
    ap.add_argument("--ae-steps", type=int, default=6000)
    ap.add_argument("--dn-steps", type=int, default=9000)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per batch (B = tokens // T)")
    ap.add_argument("--min-len", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--ae-lr", type=float, default=1e-3)
    ap.add_argument("--dn-lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--negatives", type=int, default=2048, help="uniform negative ids of the sampled softmax")
    ap.add_argument("--latent-noise", type=float, default=0.5, help="max std of the noise on the latents (phase 1)")
    ap.add_argument("--center-weight", type=float, default=1.0,
                    help="weight of the latent-centering term (phase 1, ramped in from 25 %% to 50 %% of it)")
    ap.add_argument("--self-cond", type=float, default=0.5, help="share of denoiser steps with self-conditioning")
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--stop-at-step", type=int, default=None, help="checkpoint and stop before this step")
    ap.add_argument("--stop-after-minutes", type=float, default=None, help="checkpoint and stop after this wall time")
    ap.add_argument("--reschedule", action="store_true",
                    help="on resume, accept new --ae-steps/--dn-steps (the learning-rate and centering schedules "
                         "follow the new lengths from the current step on); the change is recorded in the "
                         "checkpoint, so the run stays reproducible")
    a = ap.parse_args(argv)
    if not (1 <= a.min_len <= a.max_len <= C.DEMO_CONFIG["max_positions"]):
        ap.error(f"need 1 <= --min-len <= --max-len <= max_positions = {C.DEMO_CONFIG['max_positions']}")
    if a.ae_steps < (0 if a.init_from else 1) or a.dn_steps < 0:
        ap.error("need --ae-steps >= 1 (>= 0 with --init-from) and --dn-steps >= 0")
    if a.init_from:
        a.init_from = os.path.abspath(a.init_from)
        if not os.path.isfile(a.init_from):
            ap.error(f"--init-from {a.init_from}: no such file")
    return a


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed << 32) + step)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


class Trainer:
    def __init__(self, a):
        self.a = a
        self.cfg = C.demo_config()
        self.model = C.build_model(self.cfg, a.seed)
        m = self.model
        self.ae_params = [p for mod in (m.encoder, m.latent_decoder, m.token_decoder) for p in mod.parameters()
                          if p.requires_grad]
        self.dn_params = list(m.denoiser.parameters())
        self.opt_ae = torch.optim.AdamW(self.ae_params, lr=a.ae_lr, betas=(0.9, 0.99), weight_decay=a.weight_decay)
        self.opt_dn = torch.optim.AdamW(self.dn_params, lr=a.dn_lr, betas=(0.9, 0.99), weight_decay=a.weight_decay)
        self.ema = {k: v.detach().clone() for k, v in m.denoiser.state_dict().items()}
        self.train = C.TokenStream(a.data, "train")
        self.heldout = C.TokenStream(a.data, "heldout")
        self.step = 0
        self.elapsed = 0.0  # wall seconds of training over all pieces
        self.reschedules = []  # [{"step": s, "ae_steps": [old, new], "dn_steps": [old, new]}]
        self.init_sha256 = None  # of --init-from's file, recorded in the checkpoint
        self.val_tokens = self.heldout.windows(16, 64, torch.Generator().manual_seed(a.seed + 12345), 1.0)

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_path(self):
        return os.path.join(self.a.work, "checkpoint.pt")

    def save(self):
        state = {"step": self.step, "elapsed": self.elapsed, "recipe": {k: getattr(self.a, k) for k in RECIPE},
                 "reschedules": self.reschedules, "init_sha256": self.init_sha256,
                 "config": self.cfg.to_dict(), "model": C.trained_state(self.model), "ema": self.ema,
                 "opt_ae": self.opt_ae.state_dict(), "opt_dn": self.opt_dn.state_dict()}
        tmp = self.ckpt_path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_path)

    def resume(self):
        if not os.path.exists(self.ckpt_path):
            return
        s = torch.load(self.ckpt_path)
        recipe = {k: getattr(self.a, k) for k in RECIPE}
        self.reschedules = s.get("reschedules", [])
        lengths = ("ae_steps", "dn_steps")
        if self.a.reschedule and any(s["recipe"][k] != recipe[k] for k in lengths):
            if s["step"] >= self.a.ae_steps and s["recipe"]["ae_steps"] != self.a.ae_steps:
                sys.exit(f"train: --reschedule cannot move the end of the autoencoder phase to step "
                         f"{self.a.ae_steps}: the checkpoint is at step {s['step']}")
            if s["step"] > self.a.ae_steps + self.a.dn_steps:
                sys.exit(f"train: --reschedule: the checkpoint is at step {s['step']}, past the new end")
            self.reschedules.append({"step": s["step"], **{k: [s["recipe"][k], recipe[k]] for k in lengths}})
            print(f"rescheduled at step {s['step']}: " +
                  ", ".join(f"{k} {s['recipe'][k]} -> {recipe[k]}" for k in lengths), file=sys.stderr)
            s["recipe"] = {**s["recipe"], **{k: recipe[k] for k in lengths}}
        if s["recipe"] != recipe:
            diff = {k: (s["recipe"].get(k), v) for k, v in recipe.items() if s["recipe"].get(k) != v}
            sys.exit(f"train: {self.ckpt_path} was made with other flags (checkpoint, now): {diff}; "
                     f"use another --work or the same flags")
        if s["config"] != self.cfg.to_dict():
            sys.exit(f"train: {self.ckpt_path} holds another model configuration")
        missing, unexpected = self.model.load_state_dict(s["model"], strict=False)
        assert not unexpected and all(k.startswith("feature_model.") for k in missing), (missing, unexpected)
        self.ema = s["ema"]
        self.opt_ae.load_state_dict(s["opt_ae"])
        self.opt_dn.load_state_dict(s["opt_dn"])
        self.step, self.elapsed = s["step"], s["elapsed"]
        self.init_sha256 = s.get("init_sha256")
        if self.a.init_from and self.init_sha256 != file_sha256(self.a.init_from):
            sys.exit(f"train: --init-from {self.a.init_from} changed since {self.ckpt_path} started from it")
        log = os.path.join(self.a.work, "log.jsonl")
        if os.path.exists(log):  # drop entries written after the checkpoint
            with open(log) as f:
                keep = [line for line in f if json.loads(line)["step"] <= self.step]
            with open(log, "w") as f:
                f.writelines(keep)
        print(f"resumed from {self.ckpt_path} at step {self.step} ({self.elapsed / 60:.1f} min trained)", file=sys.stderr)

    def start_from(self, path):
        """Every trained module from an exported file; the denoiser's EMA starts at its weights."""
        loaded, meta = C.load_model_file(path)
        if C.config_from_json(meta["ldlm.config"]).to_dict() != self.cfg.to_dict():
            sys.exit(f"train: --init-from {path} holds another model configuration than the demo's")
        if int(meta["ldlm.feature_model_init_seed"]) != C.FEATURE_MODEL_SEED:
            sys.exit(f"train: --init-from {path} has feature_model_init_seed {meta['ldlm.feature_model_init_seed']}, "
                     f"expected {C.FEATURE_MODEL_SEED}")
        missing, unexpected = self.model.load_state_dict(C.trained_state(loaded), strict=False)
        assert not unexpected and all(k.startswith("feature_model.") for k in missing), (missing, unexpected)
        self.ema = {k: v.detach().clone() for k, v in self.model.denoiser.state_dict().items()}
        self.init_sha256 = file_sha256(path)
        print(f"started from {path} (sha256 {self.init_sha256[:16]}…)", file=sys.stderr)

    # ----------------------------------------------------------------------- steps
    def batch(self, g):
        a = self.a
        T = int(torch.randint(a.min_len, a.max_len + 1, (1,), generator=g))
        return self.train.windows(max(1, a.tokens // T), T, g)

    def ae_step(self, g):
        a, m = self.a, self.model
        tokens = self.batch(g)
        B, T = tokens.shape
        with torch.no_grad():
            features = m.feature_model(tokens)
        z = m.encoder(features)
        # The denoiser knows relative positions only (rotary), so latents should not
        # carry a per-position offset it cannot place: penalise the batch mean of
        # every position (the encoder's latent queries start as position rows).
        center = z.mean(0).pow(2).mean()
        noise_std = torch.rand(B, 1, 1, generator=g) * a.latent_noise
        z = z + noise_std * torch.randn(z.shape, generator=g)
        h = C.token_decoder_hidden(m.token_decoder, m.latent_decoder(z)).reshape(B * T, -1)
        targets = tokens.reshape(-1)
        negatives = torch.randint(0, self.cfg.vocab_size, (a.negatives,), generator=g)
        candidates = torch.unique(torch.cat([targets, negatives]))  # sorted, each id once
        index = torch.searchsorted(candidates, targets)
        logits = h @ m.token_decoder.lm_head.weight[candidates].t()
        ce = F.cross_entropy(logits, index)
        acc = (logits.argmax(-1) == index).float().mean().item()
        # Off for the first quarter of phase 1 (the copy path forms from position-rich
        # latents), then ramped up to full weight at half of phase 1.
        ramp = min(1.0, max(0.0, 4 * self.step / a.ae_steps - 1))
        return ce + ramp * a.center_weight * center, {"acc": acc, "ce": ce.item(), "center": center.item()}

    def dn_step(self, g):
        a, m = self.a, self.model
        tokens = self.batch(g)
        B = tokens.shape[0]
        with torch.no_grad():
            z = m.encoder(m.feature_model(tokens))
        t = torch.rand(B, generator=g)
        alpha, sigma = (v.float()[:, None, None] for v in C.alpha_sigma(t))
        x_t = alpha * z + sigma * torch.randn(z.shape, generator=g)
        self_cond = None
        if float(torch.rand(1, generator=g)) < a.self_cond:
            with torch.no_grad():
                self_cond = m.denoiser(x_t, t, None)
        x0 = m.denoiser(x_t, t, self_cond)
        return F.mse_loss(x0, z), {"sc": self_cond is not None}

    @torch.no_grad()
    def validate(self, phase):
        m = self.model
        if phase == "ae":
            r = m.reconstruct(self.val_tokens)
            acc = (r["logits"].argmax(-1) == self.val_tokens).float().mean().item()
            return {"val_acc": acc}
        z = m.encoder(m.feature_model(self.val_tokens))
        g = torch.Generator().manual_seed(777)
        out = {}
        saved = {k: v.clone() for k, v in m.denoiser.state_dict().items()}
        m.denoiser.load_state_dict(self.ema)
        for t in (0.1, 0.3, 0.5, 0.7, 0.9):
            tt = torch.full((z.shape[0],), t)
            al, si = (v.float() for v in C.alpha_sigma(torch.tensor(t)))
            x_t = al * z + si * torch.randn(z.shape, generator=g)
            x0 = m.denoiser(x_t, tt, m.denoiser(x_t, tt, None))
            out[f"val_mse_t{t}"] = F.mse_loss(x0, z).item()
        m.denoiser.load_state_dict(saved)
        return out

    # ------------------------------------------------------------------------ loop
    def run(self):
        a = self.a
        total = a.ae_steps + a.dn_steps
        os.makedirs(a.work, exist_ok=True)
        fresh = not os.path.exists(self.ckpt_path)
        if fresh and a.init_from:
            self.start_from(a.init_from)
        self.resume()
        log = open(os.path.join(a.work, "log.jsonl"), "a")
        if fresh and a.init_from:  # the starting point's held-out figures, for comparison with the end
            phase = "ae" if a.ae_steps > 0 else "dn"
            log.write(json.dumps({"step": 0, "phase": phase, **self.validate(phase)}) + "\n")
            log.flush()
        t_start, cpu_start = time.time(), time.process_time()
        elapsed0 = self.elapsed
        window = []
        bar = ProgressBar(total)
        while self.step < total:
            if a.stop_at_step is not None and self.step >= a.stop_at_step:
                break
            if a.stop_after_minutes is not None and time.time() - t_start > 60 * a.stop_after_minutes:
                break
            phase = "ae" if self.step < a.ae_steps else "dn"
            g = step_generator(a.seed, self.step)
            if phase == "ae":
                opt, params = self.opt_ae, self.ae_params
                lr = lr_at(self.step, a.ae_steps, a.ae_lr, a.warmup)
                loss, extra = self.ae_step(g)
            else:
                opt, params = self.opt_dn, self.dn_params
                lr = lr_at(self.step - a.ae_steps, a.dn_steps, a.dn_lr, a.warmup)
                loss, extra = self.dn_step(g)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip).item()
            opt.step()
            if phase == "dn":
                n = self.step - a.ae_steps  # EMA warm-up: early weights are not averaged in for long
                decay = min(a.ema, (1 + n) / (10 + n))
                with torch.no_grad():
                    for k, v in self.model.denoiser.state_dict().items():
                        self.ema[k].mul_(decay).add_(v, alpha=1 - decay)
            if not math.isfinite(loss.item()):
                sys.exit(f"train: loss is {loss.item()} at step {self.step}; not saving")
            self.step += 1
            self.elapsed = elapsed0 + time.time() - t_start
            window.append((loss.item(), extra.get("acc"), gnorm, extra.get("ce"), extra.get("center")))
            bar.show(self.step, phase, loss.item(), extra.get("acc"), self.elapsed, elapsed0)
            if self.step % a.log_every == 0 or self.step in (a.ae_steps, total):
                entry = {"step": self.step, "phase": phase, "loss": sum(w[0] for w in window) / len(window),
                         "grad_norm": sum(w[2] for w in window) / len(window), "lr": lr,
                         "elapsed": round(self.elapsed, 2), "cpu_this_piece": round(time.process_time() - cpu_start, 2)}
                if phase == "ae":
                    for key, i in (("acc", 1), ("ce", 3), ("center", 4)):
                        entry[key] = sum(w[i] for w in window) / len(window)
                window = []
                log.write(json.dumps(entry) + "\n")
                log.flush()
            if self.step % a.ckpt_every == 0 or self.step in (a.ae_steps, total):
                v = self.validate(phase)
                log.write(json.dumps({"step": self.step, "phase": phase, **v}) + "\n")
                log.flush()
                self.save()
                bar.note(f"step {self.step}: checkpoint; " + ", ".join(f"{k} {x:.4f}" for k, x in v.items()))
        self.save()
        log.close()
        bar.done()
        done = "finished" if self.step >= total else "stopped"
        print(f"{done} at step {self.step}/{total}; {self.elapsed / 60:.1f} min of training in all; "
              f"checkpoint {self.ckpt_path}", file=sys.stderr)


class ProgressBar:
    """One status line on stderr: a bar, the phase, the loss, speed and time left."""

    def __init__(self, total):
        self.total = total
        self.tty = sys.stderr.isatty()
        self.last_print = 0.0
        self.first_step = None

    def show(self, step, phase, loss, acc, elapsed, elapsed0):
        if self.first_step is None:
            self.first_step = step - 1
        now = time.time()
        if not self.tty and now - self.last_print < 30 and step != self.total:
            return
        self.last_print = now
        done = step / self.total
        width = 30
        bar = "#" * int(done * width) + "-" * (width - int(done * width))
        per_step = (elapsed - elapsed0) / max(1, step - self.first_step)
        left = per_step * (self.total - step)
        acc_s = f" acc {acc:.3f}" if acc is not None else ""
        line = (f"[{bar}] {step}/{self.total} {phase} loss {loss:.4f}{acc_s} "
                f"{per_step:.2f} s/step elapsed {hms(elapsed)} left {hms(left)}")
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def note(self, text):
        print(("\r" if self.tty else "") + text + ("\033[K\n" if self.tty else ""), end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def done(self):
        if self.tty:
            print(file=sys.stderr)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hms(s):
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def main(argv=None):
    a = parse_args(argv)
    C.set_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    Trainer(a).run()


if __name__ == "__main__":
    main()
