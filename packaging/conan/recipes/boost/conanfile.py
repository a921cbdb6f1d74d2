"""A local stand-in for ConanCenter's `boost` with header_only=True: it packages the Boost
headers already on this machine (Debian/Ubuntu: libboost-dev, /usr/include/boost).

Used by scripts/conan.sh where ConanCenter cannot be reached. It has the interface of
ConanCenter's recipe that header-only users see: the package `boost/<version of the headers>`,
the option header_only (True only), CMake package `Boost` with targets Boost::boost and
Boost::headers (component `headers`). Another header directory: BOOST_INCLUDEDIR=<dir>.

    conan create packaging/conan/recipes/boost    # -> boost/1.74.0 on Debian 12
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.files import copy, load, save

required_conan_version = ">=2.0"


def _include_dir():
    return os.environ.get("BOOST_INCLUDEDIR", "/usr/include")


class BoostSystemHeadersConan(ConanFile):
    name = "boost"
    description = "Boost headers of this machine, packaged (a local stand-in for ConanCenter's boost, header-only)"
    license = "BSL-1.0"
    package_type = "header-library"
    options = {"header_only": [True]}
    default_options = {"header_only": True}
    build_policy = "missing"
    upload_policy = "skip"

    def set_version(self):
        if self.version:
            return
        path = os.path.join(_include_dir(), "boost", "version.hpp")
        if not os.path.isfile(path):
            raise ConanException(f"no Boost headers at {path}: install libboost-dev or set BOOST_INCLUDEDIR")
        number = int(re.search(r"#define BOOST_VERSION (\d+)", load(self, path)).group(1))
        self.version = f"{number // 100000}.{number // 100 % 1000}.{number % 100}"

    def package_id(self):
        self.info.clear()

    def package(self):
        src = os.path.join(_include_dir(), "boost")
        copy(self, "*", src, os.path.join(self.package_folder, "include", "boost"))
        save(self, os.path.join(self.package_folder, "licenses", "NOTICE"),
             f"Boost headers copied from {src}, under the Boost Software License 1.0 "
             "(https://www.boost.org/LICENSE_1_0.txt).\n")

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "Boost")
        self.cpp_info.set_property("cmake_target_name", "Boost::boost")
        self.cpp_info.set_property("pkg_config_name", "boost")
        headers = self.cpp_info.components["headers"]
        headers.set_property("cmake_target_name", "Boost::headers")
        headers.bindirs = []
        headers.libdirs = []
