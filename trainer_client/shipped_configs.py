"""The run configs shipped in the package (trainer_client/configs/), found by name from any directory, and
the input files a config names, found beside the config itself.

`coding-train train --config cpu_smoke` works from an installed wheel: the name is looked up among the
packaged configs, and the smoke config's `data/cpu_smoke_pairs.jsonl` is the file packaged beside it.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"
"""The shipped configs: run configs at the top, SFT configs under `sft/`, their data under `data/`."""


def config_names(folder: str = "") -> list[str]:
    """The names of the shipped configs in `folder` (a subfolder of CONFIG_DIR: "" for run configs, "sft")."""
    return sorted(path.stem for path in (CONFIG_DIR / folder).glob("*.yaml"))


def find_config(value: str | Path, folder: str = "") -> Path:
    """`value` as a config file: the file at that path if there is one, else the shipped config of that name
    (with or without `.yaml`) in `folder`. Raises FileNotFoundError naming the shipped configs."""
    given = Path(value)
    if given.is_file():
        return given
    shipped = CONFIG_DIR / folder / (given.name if given.suffix == ".yaml" else f"{given.name}.yaml")
    if given.parent == Path() and shipped.is_file():
        return shipped
    raise FileNotFoundError(
        f"no config file {str(value)!r} and no shipped config of that name; shipped: {', '.join(config_names(folder))}"
    )


def input_path(value: str, config: Path) -> str:
    """An input file named in `config`: a relative path that exists beside the config is taken from there
    (shipped data travels with its config); any other path is kept as written, relative to the working
    directory (a user's own files, and the outputs of earlier commands such as `coding-train replay`)."""
    path = Path(value)
    beside = config.parent / path
    return str(beside) if not path.is_absolute() and beside.exists() else value
