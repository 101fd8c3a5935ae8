"""A destination's ``transform``: a Python function that shapes (or drops) each event it gets.

``transform = "shapes:to_crm"`` names ``to_crm`` in module ``shapes``: ``shapes.py`` (or the
package ``shapes/``) beside the config file, else whatever ``import shapes`` finds. It is
called with the event as a dict, as stored in ``events``, and returns:

- a dict: the body to send, as JSON (:data:`SENT`);
- None: nothing is sent, and the event is counted as dropped (:data:`DROPPED`);
- anything else, or an exception: that event alone fails (:data:`FAILED`). Its job is recorded
  as ``failed`` with the error's one line and is never sent; every other event goes on.

It runs in the route query on Spark's executors, as an Arrow UDF (many events per call): the
module beside the config is zipped and shipped to them (``SparkContext.addPyFile``), in local
mode too. A replayed micro-batch calls it again and keeps nothing of it (the JobDB's marker), so
a transform should only compute: no requests, no writes. :func:`shape_one` is the same call
for one event, as ``exactly transform`` runs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from exactly.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from exactly.delivery.settings import DestinationSettings

SENT, DROPPED, FAILED = 0, 1, 2
RESULT = "struct<outcome: tinyint, body: binary, error: string>"
MAX_ERROR = 200  # characters of an error kept with its job
SHIPPED = "exactly-transform"  # the name of the zips shipped to the executors
Shape = Callable[[dict[str, Any]], Any]
_loaded: dict[tuple[str, str, str | None], Shape] = {}  # per process (a Python worker's too)
_directories: set[Path] = set()  # the config directories modules were imported from


@dataclass(frozen=True)
class Transform:
    """Where one destination's function is: ``module:function``, and the directory holding the
    module when it is beside the config (None: importable as it is)."""

    module: str
    function: str
    directory: str | None

    @property
    def key(self) -> tuple[str, str, str | None]:
        return (self.module, self.function, self.directory)

    def source(self) -> Path | None:
        """The module's file, or its package's directory, when it is beside the config."""
        if self.directory is None:
            return None
        top = Path(self.directory) / self.module.split(".")[0]
        return top if top.is_dir() else top.with_suffix(".py")


def _beside(directory: str | None, module: str) -> str | None:
    """``directory`` when it holds ``module``'s top-level file or package, else None."""
    if directory is None:
        return None
    top = Path(directory) / module.split(".")[0]
    found = (top / "__init__.py").is_file() or top.with_suffix(".py").is_file()
    return str(Path(directory).resolve()) if found else None


def resolve(index: int, destination: DestinationSettings) -> Transform:
    """``destination``'s transform, imported once here to check it, or ConfigError naming
    ``destinations[i] (name).transform``."""
    assert destination.transform is not None
    where = f"destinations[{index}] ({destination.name}).transform"
    module, _, function = destination.transform.partition(":")
    directory = _beside(destination.transform_dir, module)
    if directory is None:
        _forget_elsewhere(Transform(module, function, ""))  # one beside another config
    if directory is None and not _importable(module.split(".")[0]):
        beside = destination.transform_dir or Path.cwd()
        raise ConfigError(
            f"{where}: {module.split('.')[0]}.py is not in {beside}, and no module "
            f"{module!r} can be imported"
        )
    transform = Transform(module, function, directory)
    try:
        load(transform)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    except Exception as error:  # noqa: BLE001 (the user's module failed to import)
        raise ConfigError(f"{where}: importing {module} failed: {one_line(error)}") from None
    return transform


@contextmanager
def _path(directory: str | None) -> Iterator[None]:
    if directory is None or directory in sys.path:
        yield
        return
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        sys.path.remove(directory)


def load(transform: Transform) -> Shape:
    """The function, imported once per process (on an executor, from the shipped zip)."""
    found = _loaded.get(transform.key)
    if found is not None:
        return found
    with _path(transform.directory):
        _forget_elsewhere(transform)
        module = importlib.import_module(transform.module)
    if transform.directory is not None:
        _directories.add(Path(transform.directory).resolve())
    function = getattr(module, transform.function, None)
    if function is None:
        raise ConfigError(f"{transform.module} has no {transform.function}")
    if not callable(function):
        raise ConfigError(f"{transform.module}.{transform.function} is not a function")
    shape: Shape = function
    _loaded[transform.key] = shape
    return shape


def _forget_elsewhere(transform: Transform) -> None:
    """Drop a module of the same name imported before from another config's directory, or
    from a zip shipped for one (``addPyFile`` puts it on this process's path too), so the one
    beside this config (``directory``; ``""``: none) is imported, or looked for anew."""
    if transform.directory is None:
        return
    top = transform.module.split(".")[0]
    for name in [name for name in sys.modules if name == top or name.startswith(f"{top}.")]:
        origin = getattr(sys.modules[name], "__file__", None)
        if origin is None:
            continue
        found = Path(origin).resolve()
        inside = bool(transform.directory) and found.is_relative_to(Path(transform.directory))
        if not inside and (found.parent in _directories or _shipped(origin)):
            del sys.modules[name]


def _shipped(origin: str | None) -> bool:
    """Whether ``origin`` is inside a zip :func:`ship` made."""
    return origin is not None and f"{SHIPPED}-" in origin


def _importable(module: str) -> bool:
    """Whether ``import module`` finds it, other than in a zip shipped for another config."""
    spec = importlib.util.find_spec(module)
    return spec is not None and not _shipped(spec.origin)


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, at most :data:`MAX_ERROR` characters."""
    text = " ".join(str(error).split())
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."


def shape_one(function: Shape, payload: bytes) -> tuple[int, bytes | None, str | None]:
    """``function`` on one stored event: (:data:`SENT`, body, None), (:data:`DROPPED`, None,
    None) or (:data:`FAILED`, None, the error's line)."""
    try:
        result = function(orjson.loads(payload))
        if result is None:
            return DROPPED, None, None
        if not isinstance(result, dict):
            return FAILED, None, f"the transform returned {type(result).__name__}, not a dict"
        return SENT, orjson.dumps(result), None
    except (Exception, SystemExit) as error:  # noqa: BLE001 (the user's code: that event alone)
        return FAILED, None, one_line(error)


def ship(spark: SparkSession, transforms: Sequence[Transform]) -> None:
    """Put each module beside the config on the executors' path (local mode too: its workers
    do not see the config's directory)."""
    from exactly.spark.session import tree_zip

    conf = spark.sparkContext.getConf()
    scratch = Path(conf.get("spark.local.dir", tempfile.gettempdir())) / "transforms"
    shipped: set[Path] = set()
    for transform in transforms:
        source = transform.source()
        if source is None or source in shipped:
            continue
        shipped.add(source)
        zipped = tree_zip(scratch, source, f"{SHIPPED}-{source.stem}")
        spark.sparkContext.addPyFile(str(zipped))


def column(transform: Transform, value: Column, take: Column) -> Column:
    """``struct<outcome, body, error>`` of the function on each event ``take`` is true for
    (null for the others), computed on the executors, an Arrow batch per call."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import functions as F

    key = Transform(transform.module, transform.function, None)  # on a worker: by name

    def shape(values: pa.Array, takes: pa.Array) -> pa.Array:
        function = load(key)
        outcomes: list[int | None] = []
        bodies: list[bytes | None] = []
        errors: list[str | None] = []
        for payload, taken in zip(values.to_pylist(), takes.to_pylist(), strict=True):
            if not taken:
                outcome, body, error = None, None, None
            else:
                outcome, body, error = shape_one(function, payload)
            outcomes.append(outcome)
            bodies.append(body)
            errors.append(error)
        return pa.StructArray.from_arrays(
            [pa.array(outcomes, pa.int8()), pa.array(bodies, pa.binary()), pa.array(errors)],
            names=["outcome", "body", "error"],
        )

    from pyspark.util import PythonEvalType

    # the type is given: the hints are text here (annotations are postponed), unreadable to Spark
    scalar = PythonEvalType.SQL_SCALAR_ARROW_UDF
    with warnings.catch_warnings():  # "type hints are preferred"
        warnings.simplefilter("ignore", UserWarning)
        udf = F.arrow_udf(shape, RESULT, scalar)  # type: ignore[attr-defined]
    shaped: Column = udf.asNondeterministic()(value, take)
    return shaped
