"""The base of every DAG's run configuration: one pydantic model, the trigger form and the check.

A DAG's params are generated from its model (:meth:`DagParams.param_schemas`), and its operators
validate ``context["params"]`` against the same model (:meth:`DagParams.from_params`), so the
form, the defaults and the code can never drift apart. No Airflow imports: the schemas are plain
JSON-schema dicts that Airflow's ``Param`` takes as keywords.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import to_jsonable_python


class InvalidParams(ValueError):
    """A DAG run's params do not describe a valid run."""


def problems(exc: ValidationError, whole: str) -> str:
    """Every problem of ``exc``, ``field: message``, joined (``whole`` names the model's own)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in exc.errors())


class DagParams(BaseModel):
    """Subclass with typed fields (``title``, ``description``, ``json_schema_extra={"section": …}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dag_id: ClassVar[str] = "dag"
    invalid: ClassVar[type[InvalidParams]] = InvalidParams

    @classmethod
    def from_params(cls, params: Any) -> Any:
        """Validate a run's params (``context["params"]``, a dict or Airflow's ParamsDict)."""
        data = {k: params[k] for k in cls.model_fields if k in params}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            # A model validator's own typed refusal (a subclass of ``invalid``) keeps its type.
            typed = [e["ctx"]["error"] for e in exc.errors() if isinstance(e.get("ctx", {}).get("error"), cls.invalid)]
            kind = type(typed[0]) if typed else cls.invalid
            raise kind(f"invalid {cls.dag_id} params: {problems(exc, 'params')}") from None

    @classmethod
    def param_schemas(cls) -> dict[str, dict[str, Any]]:
        """Each field as the JSON-schema keywords of one ``Param``: nested models become objects
        that refuse unknown keys, optional scalars a list of types, and a field with a default
        carries it (one without is required by the form)."""
        schema = cls.model_json_schema()
        definitions = schema.get("$defs", {})
        out: dict[str, dict[str, Any]] = {}
        for name, prop in schema["properties"].items():
            prop = dict(prop)
            prop.pop("default", None)
            refs = [prop.pop("$ref", None)] + [item.get("$ref") for item in prop.pop("allOf", [])]
            ref = next((r for r in refs if r), None)
            if ref is not None:
                nested = definitions[ref.rsplit("/", 1)[-1]]
                prop.update(type="object", properties=nested.get("properties", {}), additionalProperties=False)
            options = prop.get("anyOf")
            if options and len(options) == 2 and {"type": "null"} in options:  # ``X | None``
                prop.pop("anyOf")
                other = next(option for option in options if option != {"type": "null"})
                prop.update({k: v for k, v in other.items() if k != "type"})
                prop["type"] = [other.get("type", "string"), "null"]
            field = cls.model_fields[name]
            if not field.is_required():
                prop["default"] = to_jsonable_python(field.get_default(call_default_factory=True))
            out[name] = prop
        return out
