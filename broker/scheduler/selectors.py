"""Which devices belong to which device class.

A class is a DRA-style CEL selector over `device` and/or an attribute-equality `match` shorthand.
CEL is slow per evaluation (~0.3 ms with cel-python), and clusters are made of a few kinds of machine,
so each selector is compiled once and evaluated once per *distinct* device description, never per device.
"""

from __future__ import annotations

import celpy
from celpy import celtypes

from broker.scheduler.snapshot import Device, DeviceClass

_ENVIRONMENT = celpy.Environment()


def validate_selector(expression: str) -> str | None:
    """A readable error for a CEL selector that cannot be used, or None when it is fine."""
    if not expression or not expression.strip():
        return "selector is empty"
    try:
        _ENVIRONMENT.compile(expression)
    except celpy.CELParseError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "syntax error"
        return f"invalid CEL selector: {first_line}"
    except Exception as error:  # the CEL library raises assorted types for malformed input
        return f"invalid CEL selector: {error}"
    if "device" not in expression:
        return 'selector must refer to `device`, e.g. device.attributes["gpu.example.com"].model == "H100"'
    return None


def device_description(device: Device) -> tuple:
    """The part of a device a selector can see; devices with equal descriptions match equal classes."""
    return (device.driver, _frozen(device.attributes), _frozen(device.capacity))


def _frozen(mapping: dict):
    try:
        return frozenset(mapping.items())
    except TypeError:  # an unhashable attribute value (a list): fall back to its text
        return frozenset((name, repr(value)) for name, value in mapping.items())


class ClassMatcher:
    """Evaluates device classes against device descriptions, caching every answer."""

    def __init__(self, device_classes: tuple[DeviceClass, ...]):
        self._classes = tuple(sorted(device_classes, key=lambda device_class: device_class.name))
        self._programs = {
            device_class.name: _compile(device_class.selector)
            for device_class in self._classes
            if device_class.selector
        }
        self._cache: dict[tuple, frozenset[str]] = {}
        self._recent: tuple = ()  # (driver, attributes, capacity, classes) of the last few descriptions

    def classes_of(self, device: Device) -> frozenset[str]:
        """Names of the classes `device` belongs to."""
        # Clusters are made of a few kinds of device, and devices of one node come one after another:
        # compare with the few descriptions seen last (C-level dict comparisons) before freezing one.
        driver = device.driver
        attributes = device.attributes
        capacity = device.capacity
        for last in self._recent:
            if (last[1] is attributes or last[1] == attributes) and last[0] == driver and last[2] == capacity:
                return last[3]
        matched = self._classes_of_description(device)
        self._recent = ((driver, attributes, capacity, matched),) + self._recent[:3]
        return matched

    def _classes_of_description(self, device: Device) -> frozenset[str]:
        description = device_description(device)
        matched = self._cache.get(description)
        if matched is None:
            matched = frozenset(
                device_class.name for device_class in self._classes if self._matches(device_class, device)
            )
            self._cache[description] = matched
        return matched

    def _matches(self, device_class: DeviceClass, device: Device) -> bool:
        if device_class.match and not _matches_shorthand(device_class.match, device.attributes):
            return False
        program = self._programs.get(device_class.name)
        return program is None or _evaluate(program, device)


def _matches_shorthand(match: dict, attributes: dict) -> bool:
    return all(name in attributes and _equal(attributes[name], value) for name, value in match.items())


def _equal(actual, expected) -> bool:
    # YAML and the ORM disagree about "80" vs 80; a selector author means the same thing.
    return actual == expected or str(actual) == str(expected)


def _compile(expression: str):
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))


def _evaluate(program, device: Device) -> bool:
    activation = {
        "device": celpy.json_to_cel(
            {
                "driver": device.driver,
                "attributes": {device.driver: dict(device.attributes)},
                "capacity": {device.driver: dict(device.capacity)},
            }
        )
    }
    try:
        result = program.evaluate(activation)
    except Exception:
        # DRA treats a selector that errors on a device (e.g. a missing attribute) as not matching it.
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


class SelectorCache:
    """A claim request's own CEL selectors (DRA DeviceRequest.selectors) over free devices: each
    expression compiled once, each answered once per distinct attribute set. The devices are seen under
    the default driver (a Slot keeps the attributes only)."""

    def __init__(self):
        self._programs: dict[str, object] = {}
        self._answers: dict[tuple, bool] = {}

    def matches(self, expressions: tuple[str, ...], attributes: dict) -> bool:
        key = (expressions, _frozen(attributes))
        answer = self._answers.get(key)
        if answer is None:
            device = Device(id="", node="", attributes=dict(attributes))
            answer = all(_evaluate(self._program(expression), device) for expression in expressions)
            self._answers[key] = answer
        return answer

    def _program(self, expression: str):
        program = self._programs.get(expression)
        if program is None:
            program = self._programs[expression] = _compile(expression)
        return program
