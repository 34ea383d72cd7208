"""``.cuda()`` and ``"cuda"`` devices in the chunk program become the
engine's own device, so a cell written for one GPU runs on each engine's."""

from __future__ import annotations

import ast

from gpucell.protocol.program import AS_DEVICE, DEVICE, is_cuda_device

__all__: list[str] = ["rewrite_cuda"]


def _is_cuda_str(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and is_cuda_device(node.value)
    )


class _CudaRewriter:
    """``.cuda()``, ``.to("cuda")``, ``device="cuda"``, ``torch.device("cuda")``.

    A device given by a variable or expression (``.to(dev)``, ``device=cfg.dev``,
    ``torch.device(name)``) is passed through ``__gpucell_as_device__``, which maps
    a CUDA device (a ``"cuda..."`` string or a ``torch.device``) to the engine's
    and returns anything else (a dtype, a tensor, ``"cpu"``) unchanged.

    Every rewrite changes a ``Call`` node in place, so one ``ast.walk`` suffices.
    """

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.wrapped = 0

    def _device(self, loc: ast.AST) -> ast.expr:
        self.lines.append(getattr(loc, "lineno", 0))
        return ast.copy_location(ast.Name(DEVICE, ast.Load()), loc)

    def _maybe(self, e: ast.expr) -> ast.expr:
        """``e`` if it cannot be a CUDA device held in a value, else wrapped."""
        if isinstance(e, (ast.Constant, ast.Starred)) or (
            isinstance(e, ast.Name) and e.id == DEVICE
        ):
            return e
        self.wrapped += 1
        fn = ast.copy_location(ast.Name(AS_DEVICE, ast.Load()), e)
        return ast.copy_location(ast.Call(func=fn, args=[e], keywords=[]), e)

    def call(self, node: ast.Call) -> None:
        f = node.func
        if not isinstance(f, ast.Attribute):
            self._keywords(node)
            return
        if (
            f.attr == "device"
            and isinstance(f.value, ast.Name)
            and f.value.id == "torch"
            and node.args
        ):
            if _is_cuda_str(node.args[0]):
                # torch.device("cuda"[, n]) -> torch.device(__gpucell_device__)
                node.args = [self._device(node)]
                node.keywords = []
            elif len(node.args) == 1:
                node.args[0] = self._maybe(node.args[0])
            return
        if f.attr == "cuda":
            # x.cuda(), x.cuda(0), x.cuda(non_blocking=True) -> x.to(device, ...)
            node.func = ast.copy_location(ast.Attribute(f.value, "to", ast.Load()), f)
            node.args = [self._device(node)]
            node.keywords = [k for k in node.keywords if k.arg != "device"]
            return
        if f.attr == "to" and node.args:
            if _is_cuda_str(node.args[0]):
                node.args[0] = self._device(node.args[0])
            else:
                node.args[0] = self._maybe(node.args[0])
        self._keywords(node)

    def _keywords(self, node: ast.Call) -> None:
        for k in node.keywords:
            if k.arg == "device":
                if _is_cuda_str(k.value):
                    k.value = self._device(k.value)
                else:
                    k.value = self._maybe(k.value)


def rewrite_cuda(module: ast.Module) -> tuple[ast.Module, tuple[int, ...], bool]:
    """Rewrite CUDA device selections in place.

    Returns the module, the lines of the literal selections rewritten, and whether
    any device given by a value was wrapped (the program then needs
    ``__gpucell_as_device__``).
    """
    rw = _CudaRewriter()
    for node in list(ast.walk(module)):
        if isinstance(node, ast.Call):
            rw.call(node)
    return module, tuple(sorted(set(rw.lines))), rw.wrapped > 0
