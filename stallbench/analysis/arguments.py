"""A setting as a script writes it: the arguments the advice names and ``--apply`` runs (``cache_bytes=``
with ``cache_files=``, ``cache_form=``)."""

from __future__ import annotations

from stallbench.analysis.results import FormPrediction, Workload
from stallbench.conditions.sizes import format_bytes

__all__ = ["FORM_ARGUMENT", "cache_arguments", "form_argument"]

FORM_ARGUMENT = {"raw": "raw", "prepared": "prepared", "mixed": "auto"}  # a mix is only weighed, not forced


def cache_arguments(cache: int, workload: Workload) -> str:
    """The arguments as a script writes them (``cache_bytes=344_064_000``, its size beside it), with
    ``cache_files=`` the data's folders where the command's Dataset opens its own files."""
    said = f"cache_bytes={cache:_} ({format_bytes(cache)})"
    if workload.opens_own_files:
        roots = workload.data.split(",")
        said += f", cache_files={roots[0]!r}" if len(roots) == 1 else f", cache_files={roots!r}"
    return said


def form_argument(form: FormPrediction) -> str:
    """The argument that holds ``form`` (a mix is held by ``"auto"``, which weighs the split itself)."""
    said = f"cache_form={FORM_ARGUMENT[form.form]!r}"
    return said + " (a mix of prepared and raw records)" if form.form == "mixed" else said
