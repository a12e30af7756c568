"""How a long job (a reproduction, a sweep) shows where it is: lines of text, runs that failed, and one
progress bar at a time. The job calls a Display; the command line passes RichDisplay, a library
caller or a test SilentDisplay."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Display", "RichDisplay", "SilentDisplay"]


class Display(Protocol):
    def note(self, text: str) -> None:
        """A line for the reader."""

    def failed(self, text: str) -> None:
        """A run that failed: what it was and its error."""

    def start(self, label: str, total: int) -> None:
        """Open a progress bar of `total` steps."""

    def advance(self, steps: int, label: str) -> None:
        """`steps` more done; `label` says what is running now."""

    def stop(self, completed: int | None = None) -> None:
        """Close the bar (no-op when none is open), showing `completed` of `completed` where given (a
        search that ended before its bound)."""


class SilentDisplay:
    """Shows nothing."""

    def note(self, text: str) -> None:
        pass

    def failed(self, text: str) -> None:
        pass

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, steps: int, label: str) -> None:
        pass

    def stop(self, completed: int | None = None) -> None:
        pass


def progress_bar(console: Console) -> Progress:
    """The bar the command line shows: done of total, what runs now, elapsed time and ETA."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)


class RichDisplay:
    """Lines and a progress bar on a rich console (the command line's: stderr)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bar: tuple[Progress, TaskID] | None = None

    def note(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)

    def failed(self, text: str) -> None:
        self.console.print(f"[red]run failed[/red] {text}", soft_wrap=True)

    def start(self, label: str, total: int) -> None:
        self.stop()
        progress = progress_bar(self.console)
        progress.start()
        self._bar = progress, progress.add_task(label, total=total)

    def advance(self, steps: int, label: str) -> None:
        if self._bar is not None:
            progress, task = self._bar
            progress.update(task, advance=steps, description=label)

    def stop(self, completed: int | None = None) -> None:
        if self._bar is None:
            return
        progress, task = self._bar
        if completed is not None:
            progress.update(task, total=completed, completed=completed)
        progress.stop()
        self._bar = None
