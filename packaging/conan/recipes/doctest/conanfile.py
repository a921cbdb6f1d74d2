"""A local stand-in for ConanCenter's `doctest`: it packages the doctest header already on this
machine (Debian/Ubuntu: doctest-dev, /usr/include/doctest). Only ccgraph's own test build
needs it (`conan create . -c tools.build:skip_test=False`). Another directory:
DOCTEST_INCLUDEDIR=<dir>.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.files import copy, load

required_conan_version = ">=2.0"


def _include_dir():
    return os.environ.get("DOCTEST_INCLUDEDIR", "/usr/include")


class DoctestSystemHeaderConan(ConanFile):
    name = "doctest"
    description = "doctest header of this machine, packaged (a local stand-in for ConanCenter's doctest)"
    license = "MIT"
    package_type = "header-library"
    build_policy = "missing"
    upload_policy = "skip"

    def set_version(self):
        if self.version:
            return
        path = os.path.join(_include_dir(), "doctest", "doctest.h")
        if not os.path.isfile(path):
            raise ConanException(f"no doctest at {path}: install doctest-dev or set DOCTEST_INCLUDEDIR")
        text = load(self, path)
        parts = [re.search(rf"#define DOCTEST_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "*.h", os.path.join(_include_dir(), "doctest"), os.path.join(self.package_folder, "include", "doctest"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "doctest")
        self.cpp_info.set_property("cmake_target_name", "doctest::doctest")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
