"""AudioMNIST (Becker et al.) from a local root: spoken digits as log-spectrograms, speaker attributes.

Layout expected under `--data-root` (the GitHub repository soerenab/AudioMNIST as cloned):
`AudioMNIST/data/<speaker 01..60>/<digit>_<speaker>_<index>.wav` and `AudioMNIST/data/audioMNIST_meta.txt`
(the root may also be the `AudioMNIST` folder itself). Not on any package registry, so there is no
offline form; a missing root is a DataError naming the files.

Preprocessing (spec 000 §5 default): resample to 8 kHz, zero-pad/crop to 1 s, STFT log-magnitude,
resize to size x size (paper 224; default 64 for CPU memory), one channel, standardised with train
statistics. Task: the digit (10 classes). Sensitive attributes from the speaker metadata: `gender`
(female/male), `native` (no/yes native speaker), `identity` = gender x native (the paper's 4-class
attribute: male/female, native/non-native) and `accent` (the metadata's accent strings, sorted).
Speakers are the natural client ids (groups_train). Split: fixed stratified 80/20 (paper: random 80/20);
`validation` > 0 serves a fixed part of the training split as the test set, standardised with the
statistics of the rest (`fedbench.data.shipped.validation_split`), for tuning.
The arrays are cached under `<cache dir>/data/` after the first decode.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
from pathlib import Path

import numpy as np

from fedbench.data.shipped import validation_param
from fedbench.errors import DataError
from fedbench.plugin import Dataset, DatasetBundle, DatasetMeta, Paper
from fedbench.registry import register_dataset
from fedbench.spec.params import param

FILES = "AudioMNIST (AudioMNIST/data/<speaker>/*.wav and AudioMNIST/data/audioMNIST_meta.txt)"
IDENTITY = ("male native", "female native", "male non-native", "female non-native")


@dataclasses.dataclass(frozen=True)
class AudioMnistParams:
    """Parameters of AudioMNIST."""

    size: int = param(64, "spectrogram resized to size x size (paper 224)", min=8)
    sample_rate: int = param(8000, "resampling rate in Hz before the STFT", min=1000)
    test_fraction: float = param(
        0.2, "fixed stratified test fraction (seed 0)", min=0, max=1, min_open=True, max_open=True
    )
    validation: float = validation_param()


def _data_dir(root: str | None) -> Path:
    if not root:
        raise DataError(f"dataset 'audio-mnist' needs --data-root DIR holding the {FILES} files")
    for cand in (Path(root) / "AudioMNIST" / "data", Path(root) / "data", Path(root)):
        if (cand / "audioMNIST_meta.txt").is_file():
            return cand
    raise DataError(
        f"dataset 'audio-mnist': no audioMNIST_meta.txt under {root}; --data-root must hold the {FILES} files"
    )


def read_meta(path: Path) -> dict[str, dict[str, str]]:
    """The speaker metadata (a Python dict literal in the official file), keyed by 2-digit speaker id."""
    try:
        meta = ast.literal_eval(path.read_text(encoding="utf-8"))
    except (ValueError, SyntaxError) as exc:
        raise DataError(f"dataset 'audio-mnist': cannot parse {path} ({exc})") from None
    return {f"{int(k):02d}": {kk: str(vv) for kk, vv in v.items()} for k, v in meta.items()}


def spectrogram(wave: np.ndarray, rate: int, target_rate: int, size: int) -> np.ndarray:
    """1 s of audio at `target_rate` -> log-magnitude STFT resized to [size, size] (float32)."""
    from math import gcd

    from PIL import Image
    from scipy.signal import resample_poly, stft

    wave = wave.astype(np.float64)
    if wave.ndim > 1:
        wave = wave.mean(axis=1)
    g = gcd(rate, target_rate)
    wave = resample_poly(wave, target_rate // g, rate // g)
    out = np.zeros(target_rate)
    out[: min(len(wave), target_rate)] = wave[:target_rate]
    _, _, z = stft(out, fs=target_rate, nperseg=256, noverlap=192)
    logmag = np.log1p(np.abs(z)).astype(np.float32)
    return np.asarray(Image.fromarray(logmag).resize((size, size), Image.BILINEAR), dtype=np.float32)


@register_dataset("audio-mnist", "audiomnist")
class AudioMnist(Dataset):
    """AudioMNIST spoken digits (log-spectrograms), 60 speakers; gender/native/identity/accent attributes."""

    version = "2"  # 2: fixed shuffled split order (1 kept the stored order)
    needs_root = True
    paper = Paper(
        "becker2018audiomnist",
        "Interpreting and Explaining Deep Neural Networks for Classification of Audio Signals",
        "https://github.com/soerenab/AudioMNIST",
    )
    Params = AudioMnistParams
    key_optional = ("validation",)  # added later: at 0 (none) every run id stays the one it was

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        from scipy.io import wavfile

        from fedbench.data.shipped import (
            atomic_save_npz,
            data_cache_dir,
            fixed_split,
            load_npz,
            make_bundle,
            standardize,
            validation_split,
        )

        p = self.params
        data = _data_dir(data_root)
        meta = read_meta(data / "audioMNIST_meta.txt")
        paths = sorted(data.glob("*/*.wav"))
        if not paths:
            raise DataError(f"dataset 'audio-mnist': no <speaker>/*.wav files under {data}")
        key = "\n".join([str(p.size), str(p.sample_rate), *map(str, paths)])
        cache = data_cache_dir() / f"audio-mnist-{p.size}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
        cached = load_npz(cache)
        if cached is not None and len(cached.get("x", ())) == len(paths):
            x = cached["x"]
        else:
            x = np.empty((len(paths), p.size, p.size), dtype=np.float32)
            for i, path in enumerate(paths):
                rate, wave = wavfile.read(path)
                x[i] = spectrogram(wave, rate, p.sample_rate, p.size)
            atomic_save_npz(cache, x=x)
        digit, speaker = [], []
        for path in paths:
            d, s, _ = path.stem.split("_")
            digit.append(int(d))
            speaker.append(f"{int(s):02d}")
        missing = sorted(set(speaker) - set(meta))
        if missing:
            raise DataError(
                f"dataset 'audio-mnist': speakers {', '.join(missing)} are not in audioMNIST_meta.txt"
            )
        y = np.asarray(digit, dtype=np.int64)
        gender = np.asarray([meta[s]["gender"].lower() == "male" for s in speaker], dtype=np.int64)
        native = np.asarray(
            [meta[s].get("native speaker", "").lower() == "yes" for s in speaker], dtype=np.int64
        )
        accents = tuple(sorted({meta[s].get("accent", "").lower() for s in speaker}))
        accent = np.asarray(
            [accents.index(meta[s].get("accent", "").lower()) for s in speaker], dtype=np.int64
        )
        identity = (1 - native) * 2 + (1 - gender)  # male native, female native, male non-native, ...
        ids = sorted(set(speaker))
        groups = np.asarray([ids.index(s) for s in speaker], dtype=np.int64)
        attrs = {"identity": identity, "gender": gender, "native": native, "accent": accent}
        tr, te = fixed_split(y, p.test_fraction, shuffle=True)  # stored by speaker
        if p.validation:  # the test split is dropped: the validation set stands in (train' statistics)
            keep, val = validation_split(y[tr], p.validation, f"dataset '{self.name}'", shuffle=True)
            tr, te = tr[keep], tr[val]
        x_tr, x_te = standardize(x[tr].reshape(len(tr), -1), x[te].reshape(len(te), -1))
        info = DatasetMeta(
            name=self.name,
            input_shape=(1, p.size, p.size),
            num_classes=10,
            modality="audio",
            class_names=tuple(str(i) for i in range(10)),
            attribute_names={
                "identity": IDENTITY,
                "gender": ("female", "male"),
                "native": ("non-native", "native"),
                "accent": accents,
            },
            source="AudioMNIST (soerenab/AudioMNIST), local root",
            license="MIT (AudioMNIST repository)",
        )
        bundle = make_bundle(
            info,
            x_tr,
            y[tr],
            x_te,
            y[te],
            attr_train={k: v[tr] for k, v in attrs.items()},
            attr_test={k: v[te] for k, v in attrs.items()},
            groups_train=groups[tr],
        )
        shape = (-1, 1, p.size, p.size)
        return dataclasses.replace(
            bundle, x_train=bundle.x_train.reshape(shape), x_test=bundle.x_test.reshape(shape)
        )
