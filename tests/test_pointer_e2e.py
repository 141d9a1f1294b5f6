"""Pointer networks end to end: tiny fairseq-train + fairseq-generate through the CLI (--user-dir)."""
import os

import pytest

from conftest import PLUGIN_DIR, run_cli

from fairseq_nat_ext.data import pointer_geometry as geo


@pytest.fixture(scope="module")
def tsp_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tsp")
    for split, count, seed in (("train", 64, 1), ("valid", 16, 2), ("test", 12, 3)):
        assert geo.main(["--problem", "tsp", "--n", "5-7", "--count", str(count), "--seed", str(seed),
                         "--out", str(d / f"{split}.txt")]) == 0
    return str(d)


def test_cli_train_then_generate_prints_valid_tours(tsp_dir, tmp_path):
    save = str(tmp_path / "ck")
    common = [tsp_dir, "--user-dir", PLUGIN_DIR, "--task", "pointer_geometry", "--problem", "tsp"]
    run_cli(["fairseq-train"] + common + [
        "--arch", "pointer_lstm", "--pointer-hidden-dim", "16", "--pointer-embed-dim", "8",
        "--criterion", "pointer_cross_entropy", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16",
        "--max-update", "3", "--save-dir", save, "--no-epoch-checkpoints", "--augment", "dihedral,permute",
        "--num-workers", "0", "--disable-validation"])
    ckpt = os.path.join(save, "checkpoint_last.pt")
    proc = run_cli(["fairseq-generate"] + common + ["--path", ckpt, "--beam", "3", "--nbest", "2",
                                                    "--batch-size", "5", "--gen-subset", "test"])
    lines = proc.stdout.splitlines()
    sources = {ln.split("\t")[0][2:]: ln.split("\t")[1].split() for ln in lines if ln.startswith("S-")}
    hyps = [ln.split("\t") for ln in lines if ln.startswith("H-")]
    targets = [ln for ln in lines if ln.startswith("T-")]
    assert len(sources) == 12 and len(targets) == 12 and len(hyps) == 24  # nbest 2
    for tag, score, text in hyps:
        n = len(sources[tag[2:]])
        tour = [int(v) for v in text.split()]  # printed 1-based, closed, </s> stripped
        assert tour[0] == tour[-1] == 1 and sorted(tour[:-1]) == list(range(1, n + 1))
        assert float(score) < 0


def _setup(data_dir, problem, arch_args=()):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--user-dir", PLUGIN_DIR, "--task", "pointer_geometry",
                                                "--problem", problem, "--arch", "pointer_lstm",
                                                "--pointer-hidden-dim", "8", "--pointer-embed-dim", "8",
                                                "--criterion", "pointer_cross_entropy"] + list(arch_args))
    task = tasks.setup_task(args)
    return task, args


def test_batches_cover_every_example_and_collate_the_file(tsp_dir):
    import torch

    from fairseq_nat_ext.data.pointer_format import read_pointer_file

    task, args = _setup(tsp_dir, "tsp")
    task.load_dataset("test")
    data = read_pointer_file(os.path.join(tsp_dir, "test.txt"), "tsp")
    seen = []
    for batch in task.get_batch_iterator(task.dataset("test"), max_sentences=5).next_epoch_itr(shuffle=False):
        net = batch["net_input"]
        for row, i in enumerate(batch["id"].tolist()):
            n = len(data.points_of(i))
            assert net["src_lengths"][row] == n
            assert torch.allclose(net["src_coords"][row, :n], torch.tensor(data.points_of(i), dtype=torch.float32))
            assert task.source_dictionary.string(net["src_tokens"][row, :n]) == " ".join(map(str, range(1, n + 1)))
            out = data.output_of(i) + 1
            tgt = batch["target"][row]
            assert task.target_dictionary.string(tgt[tgt != task.target_dictionary.pad()]) == " ".join(map(str, out))
            slots = batch["target_slots"][row]
            assert slots[:len(out) + 1].tolist() == out.tolist() + [0] and (slots[len(out) + 1:] == -1).all()
            assert net["prev_output_slots"][row, :len(out) + 1].tolist() == [0] + out.tolist()
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(12))  # no batch dropped (required_batch_size_multiple)


def test_criterion_is_the_summed_pointer_nll(tsp_dir):
    import torch

    task, args = _setup(tsp_dir, "tsp")
    task.load_dataset("valid")
    model, crit = task.build_model(args), task.build_criterion(args)
    batch = next(iter(task.get_batch_iterator(task.dataset("valid"), max_sentences=4).next_epoch_itr(shuffle=False)))
    loss, sample_size, log = crit(model, batch)
    lp = torch.log_softmax(model(**batch["net_input"]), -1)
    t = batch["target_slots"]
    manual = -sum(float(lp[b, i, t[b, i]]) for b in range(t.size(0)) for i in range(t.size(1)) if t[b, i] >= 0)
    assert float(loss) == pytest.approx(manual, rel=1e-5)
    assert sample_size == int((t >= 0).sum()) == log["ntokens"]


def test_generation_refuses_a_model_trained_on_another_problem(tsp_dir, tmp_path):
    from fairseq_nat_ext.compat import InputError

    task, args = _setup(tsp_dir, "tsp")
    model = task.build_model(args)
    assert model.problem == "tsp" and args.pointer_problem == "tsp"
    hull_dir = tmp_path / "hull"
    assert geo.main(["--problem", "convex_hull", "--n", "5", "--count", "2", "--out", str(hull_dir / "test.txt")]) == 0
    hull_task, _ = _setup(str(hull_dir), "convex_hull")
    with pytest.raises(InputError, match="trained on tsp, not --problem convex_hull"):
        hull_task.build_model(args)


def test_recipe_trains_with_randomised_index_positions(tsp_dir, tmp_path):
    """examples/train_pointer.sh INDEX_RANGE=L passes --pointer-index-range to pointer_transformer (the
    checkpoint keeps it, generation decodes valid tours with it) and refuses it for pointer_lstm."""
    import subprocess

    from fairseq import checkpoint_utils

    from conftest import cli_env

    recipe = os.path.join(os.path.dirname(PLUGIN_DIR), "examples", "train_pointer.sh")
    small = ["--encoder-embed-dim", "16", "--encoder-attention-heads", "2", "--encoder-ffn-embed-dim", "32",
             "--encoder-layers", "1", "--decoder-layers", "1", "--disable-validation"]
    save = str(tmp_path / "ck")
    env = dict(cli_env(), PROBLEM="tsp", ARCH="pointer_transformer", INDEX_RANGE="32", MAX_UPDATE="2",
               BATCH_SIZE="16", THREADS="1")
    proc = subprocess.run(["bash", recipe, tsp_dir, save] + small, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = os.path.join(save, "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)  # torch's safe loader + the plugin's allow-list
    assert state["cfg"]["model"].pointer_index_range == 32
    out = run_cli(["fairseq-generate", tsp_dir, "--user-dir", PLUGIN_DIR, "--task", "pointer_geometry",
                   "--problem", "tsp", "--path", ckpt, "--beam", "2", "--batch-size", "5", "--gen-subset", "test"])
    tours = [[int(v) for v in ln.split("\t")[2].split()] for ln in out.stdout.splitlines() if ln.startswith("H-")]
    assert len(tours) == 12 and all(t[0] == t[-1] == 1 and len(set(t[:-1])) == len(t) - 1 for t in tours)
    env["ARCH"] = "pointer_lstm"
    proc = subprocess.run(["bash", recipe, tsp_dir, str(tmp_path / "lstm")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1 and "INDEX_RANGE=32 needs ARCH=pointer_transformer" in proc.stderr
