"""Each operator parameter declared once, in the operator's ``__init__`` signature, its ``Param`` beside
its type::

    num_workers: Annotated[int | Sequence[int] | str, Param("...", templated=True)] = NUM_WORKERS,

The signature gives the name, the type and the default, as mypy and users' editors read any signature;
the ``Param`` gives the rest: the parameter's doc, whether it is templated (and how the UI renders it),
and the check its value gets before anything is submitted. From that one declaration come the
operator's ``template_fields`` and ``template_fields_renderers``, its attributes, the checked values
its plan is built from, its docstring's parameters and the parameter tables of docs/parameters.md
(``scripts/parameter_tables.py``). An operator's declaration composes its base's, as the Amazon
provider composes ``aws_template_fields``.

Why a signature, and not ``**kwargs: Unpack[SomeTypedDict]``: an operator also takes BaseOperator's
own keyword arguments (``task_id``, ``retries``, ``pool``, ...), and mypy accepts no key beyond a
TypedDict's (PEP 728's ``extra_items`` is not supported: tried with mypy 2.4), so every DAG would be
flagged unless the TypedDict re-listed BaseOperator's fifty arguments, which differ between Airflow
versions. A ``dataclass_transform`` base would synthesise an ``__init__`` without them too. A plain
signature ending in ``**kwargs`` is read as it is by every checker and editor, and by Airflow itself
(``partial``/``expand`` check names against it).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# A check takes the parameter's name and its value, and returns the value checked (normalised), or
# raises InvalidParameterError naming the parameter, the value and the fix (``checks``).
Check = Callable[[str, Any], Any]
REQUIRED: Any = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Param:
    """What a parameter's signature does not say.

    :param doc: what it does, one paragraph (the docstring and docs/parameters.md show it).
    :param templated: rendered by Jinja before ``execute`` (one of the ``template_fields``).
    :param renderer: how Airflow's UI shows the rendered value (``"json"``).
    :param check: its check alone; None where the plan checks it together with the parameters it
        depends on (``num_workers`` with ``trainer_api``, say).
    :param attribute: the operator's attribute that keeps it, where that is not its name.
    """

    doc: str
    templated: bool = False
    renderer: str | None = None
    check: Check | None = None
    attribute: str | None = None


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declared parameter: its name, its annotation as written, its default (``REQUIRED``: none) and
    its Param."""

    name: str
    annotation: str
    default: Any
    param: Param

    @property
    def type(self) -> str:
        """The type as written (read only for the docs: a DAG parse does not pay for it)."""
        return _type_as_written(self.annotation)

    @property
    def attribute(self) -> str:
        return self.param.attribute or self.name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _type_as_written(annotation: str) -> str:
    """``int | None`` of ``"Annotated[int | None, Param(...)]"`` (the modules' annotations are strings)."""
    node = ast.parse(annotation, mode="eval").body
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
        return ast.unparse(node.slice.elts[0])
    return ast.unparse(node)


@dataclasses.dataclass(frozen=True)
class Declaration:
    """The parameters an operator's ``__init__`` declares (``own``), and its base's."""

    own: tuple[Declared, ...]
    base: Declaration | None = None

    @classmethod
    def of(cls, init: Callable[..., None], *, base: Declaration | None = None) -> Declaration:
        """Read from ``init``'s signature: every parameter but ``self`` and ``**kwargs`` must carry a Param."""
        hints = typing.get_type_hints(init, include_extras=True)
        own = []
        for name, parameter in inspect.signature(init).parameters.items():
            if name == "self" or parameter.kind is parameter.VAR_KEYWORD:
                continue
            found = [m for m in getattr(hints.get(name), "__metadata__", ()) if isinstance(m, Param)]
            if not found:
                raise TypeError(f"{init.__qualname__}: parameter {name!r} is declared without a Param")
            own.append(Declared(name, str(parameter.annotation), parameter.default, found[0]))
        return cls(tuple(own), base)

    def __iter__(self) -> Iterator[Declared]:
        """The base's parameters, then this operator's own."""
        yield from self.base or ()
        yield from self.own

    def __getitem__(self, name: str) -> Declared:
        found = [d for d in self if d.name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self)

    @property
    def template_fields(self) -> tuple[str, ...]:
        """This operator's templated parameters, then its base's."""
        own = tuple(d.attribute for d in self.own if d.param.templated)
        return own + (self.base.template_fields if self.base else ())

    @property
    def template_fields_renderers(self) -> dict[str, str]:
        return {d.attribute: d.param.renderer for d in self if d.param.renderer}

    def store(self, operator: Any, values: Mapping[str, Any]) -> None:
        """Keep each declared parameter among ``values`` (an ``__init__``'s ``locals()``) as the operator's
        attribute; nothing is checked here: ``__init__`` runs at every DAG parse, before rendering."""
        for declared in self:
            if declared.name in values:
                setattr(operator, declared.attribute, values[declared.name])

    def checked(self, operator: Any) -> dict[str, Any]:
        """The operator's values of every declared parameter (rendered, at ``execute``), each through its
        check; those without one as they are, for the plan to check with the others they depend on."""
        values = {}
        for declared in self:
            value = getattr(operator, declared.attribute)
            values[declared.name] = declared.param.check(declared.name, value) if declared.param.check else value
        return values

    def docstring(self, head: str | None) -> str:
        """``head`` (the class's own docstring) and a ``:param:`` line for each of this operator's own."""
        lines = [inspect.cleandoc(head or "").rstrip(), ""]
        for declared in self.own:
            default = "" if declared.required else f" Default: ``{declared.default!r}``."
            templated = " Templated." if declared.param.templated else ""
            lines.append(f":param {declared.name}: {declared.param.doc}{templated}{default}")
        return "\n".join(lines)

    def markdown(self) -> str:
        """This operator's own parameters as a Markdown table (docs/parameters.md's)."""
        rows = ["| parameter | type | default | templated | what it does |", "|---|---|---|---|---|"]
        for declared in self.own:
            default = "required" if declared.required else f"`{declared.default!r}`"
            cells = [
                f"`{declared.name}`",
                f"`{declared.type}`",
                default,
                "yes" if declared.param.templated else "",
                declared.param.doc,
            ]
            # A pipe splits a cell even inside a code span unless escaped (GitHub's tables).
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        return "\n".join(rows)
