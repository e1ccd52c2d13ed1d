"""``gpuops train``: train the anomaly and failure models from recordings with ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("train")(train)


def train(
    recordings: list[Path] = typer.Argument(..., exists=True, file_okay=False, help="Recording directories with incidents.jsonl."),
    out: Path = typer.Option(..., "--out", help="Model directory to write."),
    seed: int = typer.Option(0, "--seed", help="Random seed (sampling, trees)."),
    members: int = typer.Option(1, "--members", min=1, max=9,
                                help="Failure classifiers averaged, trained with seeds SEED, SEED+1, ... on the same "
                                     "rows (a seed ensemble: steadier on fleets nobody trained on)."),
    val_fraction: float = typer.Option(0.3, "--val-fraction", min=0.05, max=0.9,
                                       help="Share at the end of each recording held out (time split)."),
    anomaly_only: bool = typer.Option(False, "--anomaly-only",
                                      help="Refit only the anomaly detector, on these recordings' healthy rows and "
                                           "today's model inputs; keep --base's classifier and rules as they are."),
    base: Optional[Path] = typer.Option(None, "--base", help="With --anomaly-only: the model whose classifier and "
                                        "rules are kept (default: the shipped model)."),
) -> None:
    """Train models from recordings (time-based split, no leakage) and save them as a model directory."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from collector.recording import RecordingError
    from models.base import ModelError
    from models.bundle import ModelBundle, default_model_path
    from models.training import TrainingError, TrainSettings, retrain_anomaly, train_bundle

    console = Console(stderr=True)
    if base is not None and not anomaly_only:
        console.print("[red]error:[/red] --base goes with --anomaly-only (a whole model is trained from scratch)")
        raise typer.Exit(2)
    settings = TrainSettings(seed=seed, val_fraction=val_fraction, members=members)
    try:
        kept = ModelBundle.load(base or default_model_path()) if anomaly_only else None
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            tasks = [bar.add_task(f"features {r.name}", total=1.0) for r in recordings]
            step = lambda i, f: bar.update(tasks[i], completed=f)  # noqa: E731
            if kept is not None:
                bundle = retrain_anomaly(recordings, kept, settings, progress=step)
            else:
                bundle = train_bundle(recordings, settings, progress=step)
            console.print("fitting models...")
    except (TrainingError, RecordingError, ModelError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    bundle.save(out)
    if kept is not None:
        a = bundle.metadata["anomaly_training"]
        console.print(f"model saved to {out}: anomaly detector refit on {a['healthy_train_rows']:,} healthy rows "
                      f"({len(a['viewed'])} features viewed), classifier and rules from {base or 'the shipped model'}, "
                      f"{a['seconds']} s")
        return
    m = bundle.metrics
    console.print(f"model saved to {out}: {bundle.metadata['training']['train_rows']:,} training rows, "
                  f"validation AP {m.get('average_precision', float('nan')):.3f}, "
                  f"ROC AUC {m.get('roc_auc', float('nan')):.3f}, "
                  f"{bundle.metadata['training']['seconds']} s")
