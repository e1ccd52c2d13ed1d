"""``gpuops train``: train the anomaly and failure models from recordings with ground truth."""

from __future__ import annotations

from pathlib import Path

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
) -> None:
    """Train models from recordings (time-based split, no leakage) and save them as a model directory."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from models.training import TrainingError, TrainSettings, train_bundle
    from collector.recording import RecordingError

    console = Console(stderr=True)
    settings = TrainSettings(seed=seed, val_fraction=val_fraction, members=members)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            tasks = [bar.add_task(f"features {r.name}", total=1.0) for r in recordings]
            bundle = train_bundle(recordings, settings, progress=lambda i, f: bar.update(tasks[i], completed=f))
            console.print("fitting models...")
    except (TrainingError, RecordingError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    bundle.save(out)
    m = bundle.metrics
    console.print(f"model saved to {out}: {bundle.metadata['training']['train_rows']:,} training rows, "
                  f"validation AP {m.get('average_precision', float('nan')):.3f}, "
                  f"ROC AUC {m.get('roc_auc', float('nan')):.3f}, "
                  f"{bundle.metadata['training']['seconds']} s")
