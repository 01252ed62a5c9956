"""The ``kubeplane`` command."""

from __future__ import annotations

import click

from kubeplane import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubeplane")
def main() -> None:
    """kubeplane: a Kubernetes control plane in Python."""


if __name__ == "__main__":  # pragma: no cover
    main()
