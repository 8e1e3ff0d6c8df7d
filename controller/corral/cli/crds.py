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
@click.option(
    "--chart",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("charts/corral"),
    show_default=True,
    help="The Helm chart that carries them too (crds/ and templates/admission-policies.yaml); '' for none.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the files differ from the models.")
def crds(directory: Path, chart: Path, check: bool) -> None:
    """Generate CustomResourceDefinitions and ValidatingAdmissionPolicies from the API models."""
    with_chart = str(chart) not in ("", ".")
    if check:
        problems = manifests.stale(directory) + (manifests.stale_chart(chart) if with_chart else [])
        if problems:
            raise click.ClickException(
                f"stale: {', '.join(problems)}; run `corral crds` and commit the result"
            )
        click.echo(f"{directory}{' and ' + str(chart) if with_chart else ''} are up to date")
        return
    for path in manifests.write(directory) + (manifests.write_chart(chart) if with_chart else []):
        click.echo(f"wrote {path}")
