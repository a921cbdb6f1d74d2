"""Conan 2 recipe of ccgraph, a header-only C++20 library.

    conan create . -s compiler.cppstd=20          # package it, then build and run test_package/

Requirements: Boost (headers only: Boost.Hana), from ConanCenter's `boost` with
header_only=True, or any recipe named `boost` with a `headers` component (scripts/conan.sh uses
packaging/conan/recipes/boost, which packages the machine's own Boost headers, where ConanCenter
cannot be reached). doctest is needed only to run ccgraph's own tests, which this recipe builds
and runs only with `-c tools.build:skip_test=False`. CUDA and NCCL are not Conan packages: they
are found on the system when a consumer's CMake loads the package, and `ccgraph::cuda` exists
when both are found (packaging/conan/ccgraph_cuda.cmake).
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout
from conan.tools.scm import Version

required_conan_version = ">=2.0"


class CcgraphConan(ConanFile):
    name = "ccgraph"
    description = ("Typed collective/compute graphs for NCCL and CUDA Graphs: PyTorch's functional "
                   "collectives, Inductor-style scheduling and CUDA Graph replay in header-only C++20")
    license = "Apache-2.0"
    topics = ("nccl", "cuda", "cuda-graphs", "collectives", "distributed", "pytorch", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # Headers and the CMake glue are what the package holds; the rest is for the optional test
    # build (tools.build:skip_test=False).
    exports_sources = ("include/*", "LICENSE", "CMakeLists.txt", "cmake/*", "src/*", "tests/*",
                       "packaging/conan/ccgraph_cuda.cmake")
    no_copy_source = True
    default_options = {"boost/*:header_only": True}

    @property
    def _run_tests(self):
        return not self.conf.get("tools.build:skip_test", default=True, check_type=bool)

    def set_version(self):
        if self.version:
            return
        cmakelists = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = re.search(r"project\(ccgraph\s+VERSION\s+([0-9.]+)", cmakelists).group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # Public headers include Boost.Hana: consumers need Boost's include directory too.
        self.requires("boost/[>=1.71 <2]", transitive_headers=True, libs=False)

    def build_requirements(self):
        if self._run_tests:
            self.test_requires("doctest/[>=2.4.8 <3]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.compiler == "gcc" and Version(self.settings.compiler.version) < "12":
            raise ConanInvalidConfiguration(f"{self.ref} needs g++ 12 or newer (C++20)")

    def package_id(self):
        self.info.clear()

    def generate(self):
        if self._run_tests:
            CMakeToolchain(self).generate()
            CMakeDeps(self).generate()

    def build(self):
        # Header-only: nothing to build, unless the tests were asked for. Then the CPU test
        # executable is built against the Conan-provided Boost and doctest and run; the
        # structure and compile-fail checks are compiler-only and stay in ccgraph's own CI.
        if not self._run_tests:
            return
        cmake = CMake(self)
        cmake.configure(variables={"CCGRAPH_BUILD_TESTS": "ON", "CCGRAPH_BUILD_EXAMPLES": "OFF",
                                   "CCGRAPH_BUILD_BENCH": "OFF", "CCGRAPH_BUILD_DOCS": "OFF",
                                   "CCGRAPH_INSTALL": "OFF"})
        cmake.build(target="ccgraph_tests")
        self.run(f'ctest --test-dir "{self.build_folder}" -L cpu --output-on-failure', env="conanrun")

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        for pattern in ("*.hpp", "*.ipp", "*.cuh"):
            copy(self, pattern, os.path.join(self.source_folder, "include"),
                 os.path.join(self.package_folder, "include"))
        cmake_dir = os.path.join(self.package_folder, self._cmake_module_dir)
        copy(self, "FindNCCL.cmake", os.path.join(self.source_folder, "cmake"), cmake_dir)
        copy(self, "ccgraph_cuda.cmake", os.path.join(self.source_folder, "packaging", "conan"), cmake_dir)

    @property
    def _cmake_module_dir(self):
        return os.path.join("share", "ccgraph", "cmake")

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "ccgraph")
        self.cpp_info.set_property("cmake_target_name", "ccgraph::ccgraph")
        self.cpp_info.set_property("pkg_config_name", "ccgraph")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.requires = ["boost::headers"]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
            self.cpp_info.cxxflags = ["-pthread"]
        # Defines ccgraph::cuda where the CUDA toolkit and NCCL are found at consume time.
        self.cpp_info.builddirs = [self._cmake_module_dir]
        self.cpp_info.set_property("cmake_build_modules",
                                   [os.path.join(self._cmake_module_dir, "ccgraph_cuda.cmake")])
