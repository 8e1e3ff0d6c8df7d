"""`corral crds`: write the generated CRDs and admission policies, or check that they are current."""

from __future__ import annotations

from pathlib import Path

import click

from corral.api import manifests


@click.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("crds"),
    show_default=True,
    help="Where the YAML files go.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the files differ from the models.")
def crds(directory: Path, check: bool) -> None:
    """Generate CustomResourceDefinitions and ValidatingAdmissionPolicies from the API models."""
    if check:
        problems = manifests.stale(directory)
        if problems:
            raise click.ClickException(
                f"{directory} is stale ({', '.join(problems)}); run `corral crds --dir {directory}` and commit the result"
            )
        click.echo(f"{directory} is up to date")
        return
    for path in manifests.write(directory):
        click.echo(f"wrote {path}")
