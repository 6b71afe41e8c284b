"""What this installation carries and sees: version, backends built in, devices
(`python -m edbatch`)."""
import os

import torch

from . import _lib
from ._version import __version__


def backends():
    """The backends built into the loaded extension: "cpu", "null", and "cuda" when built with
    CUDA (whether a GPU is present or not: device_status says)."""
    _lib.load()
    names, _ = torch.ops.edbatch.build_info()
    return list(names)


def cuda_tensor_path():
    """Where CUDA tensors go through the ops: "gpu" (they stay on the device, the CUDA backend
    works on them in place) or "host" (a round trip through host memory)."""
    _lib.load()
    return torch.ops.edbatch.build_info()[1]


def device_status(device):
    """"" when edbatch can run on `device` ("cpu", "null", "cuda", or a torch.device, read as its
    type) here, else why not."""
    _lib.load()
    if isinstance(device, torch.device):
        device = device.type  # the backend: "cuda" for cuda:N as well
    if not isinstance(device, str):
        raise TypeError(f"device_status: device must be a str (\"cpu\", \"null\", \"cuda\") or "
                        f"a torch.device, got {type(device).__name__}")
    return torch.ops.edbatch.device_status(device)


def info():
    """Everything `python -m edbatch` prints, as a dict."""
    path = _lib.load()
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                         "capability": f"{major}.{minor}"})
    return {
        "version": __version__,
        "package": os.path.dirname(os.path.abspath(__file__)),
        "extension": path,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "backends": backends(),
        "cuda_tensors": cuda_tensor_path(),
        "devices": {"cpu": {"threads": torch.get_num_threads(), "cores": os.cpu_count()},
                    "cuda": {"status": device_status("cuda") or "usable", "gpus": gpus}},
        "cells": list(torch.ops.edbatch.cells()),
    }


def format_info(d):
    """info() as the lines `python -m edbatch` prints."""
    cuda = d["devices"]["cuda"]
    tensors = ""
    if "cuda" in d["backends"]:
        tensors = " (CUDA tensors " + ("stay on the GPU)" if d["cuda_tensors"] == "gpu" else
                                       "go through host memory)")
    lines = [f"edbatch {d['version']}",
             f"  package:   {d['package']}",
             f"  extension: {d['extension']}",
             f"  torch:     {d['torch']} (CUDA {d['torch_cuda'] or 'none'})",
             "backends built in: " + ", ".join(d["backends"]) + tensors,
             "devices:",
             f"  cpu: {d['devices']['cpu']['cores']} cores, torch uses "
             f"{d['devices']['cpu']['threads']} threads",
             f"  cuda: {cuda['status']}"]
    for g in cuda["gpus"]:
        lines.append(f"    cuda:{g['index']} {g['name']} (compute capability {g['capability']})")
    lines.append("cells: " + ", ".join(d["cells"]))
    return "\n".join(lines)
